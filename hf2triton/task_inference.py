"""A model's `task:` when config.yaml leaves it out: inferred from what the model says about itself.

Read at parse time (the task decides the DAG's rules and params), so it must be cheap and the same on every rerun:
a local or package source's files are read in place (config.json's `architectures`, sentence-transformers'
modules.json / config_sentence_transformers.json, README.md's front matter `pipeline_tag`); a hub source's model
info (its `pipeline_tag`, file list and config.json) is asked once and kept under `<paths.work>/hub/tasks/`, keyed by
repository and revision, so a rerun reads that record instead of the hub. What was found is kept, not the
conclusion, so a newer mapping applies without asking again.

Order: an explicit `task:` (never inferred), then a supported pipeline_tag, then sentence-transformers files, then the
architectures. Anything ambiguous or unknown is refused naming the model, what was found and the values to write.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from hf2triton.errors import UserError
from hf2triton.fsutil import atomic_write_json
from hf2triton.serving.interface import (
    CLASSIFICATION,
    CROSS_ENCODER_KEY,
    FEATURE_EXTRACTION,
    FILL_MASK,
    GENERATION,
    IMAGE_CLASSIFICATION,
    SPEECH_RECOGNITION,
    TASKS,
    TEXT_RANKING,
    TOKEN_CLASSIFICATION,
    ZERO_SHOT_IMAGE_CLASSIFICATION,
)
from hf2triton.specs import Source

TEXT2TEXT_GENERATION = "text2text-generation"  # mapped below; inferred only once serving.interface.TASKS has it

# the Hub's pipeline tags -> tasks (a tag whose task is not in TASKS is refused, never guessed around)
TASK_OF_PIPELINE_TAG = {
    "text-generation": GENERATION,
    "feature-extraction": FEATURE_EXTRACTION,
    "sentence-similarity": FEATURE_EXTRACTION,
    "text-classification": CLASSIFICATION,
    "token-classification": TOKEN_CLASSIFICATION,
    "fill-mask": FILL_MASK,
    "text-ranking": TEXT_RANKING,
    "text2text-generation": TEXT2TEXT_GENERATION,
    "summarization": TEXT2TEXT_GENERATION,
    "translation": TEXT2TEXT_GENERATION,
    "image-classification": IMAGE_CLASSIFICATION,
    "zero-shot-image-classification": ZERO_SHOT_IMAGE_CLASSIFICATION,
    "automatic-speech-recognition": SPEECH_RECOGNITION,
}

# architecture class name suffixes -> tasks, the most specific first (GPT2LMHeadModel is a generator, not a *Model);
# *ForSequenceClassification is decided by its labels (sequence_classification_task)
TASK_OF_ARCHITECTURE_SUFFIX = (
    ("ForCausalLM", GENERATION),
    ("ForConditionalGeneration", TEXT2TEXT_GENERATION),
    ("WithLMHeadModel", TEXT2TEXT_GENERATION),  # T5WithLMHeadModel, the old name of T5ForConditionalGeneration
    ("EncoderDecoderModel", TEXT2TEXT_GENERATION),
    ("LMHeadModel", GENERATION),
    ("ForTokenClassification", TOKEN_CLASSIFICATION),
    ("ForMaskedLM", FILL_MASK),
    ("ForCTC", SPEECH_RECOGNITION),  # wav2vec2, HuBERT: a CTC head over audio
    ("ForImageClassification", IMAGE_CLASSIFICATION),
    ("ForImageClassificationWithTeacher", IMAGE_CLASSIFICATION),  # DeiT's distilled classifier
    ("Model", FEATURE_EXTRACTION),
)
# image-text dual encoders (a *Model suffix, but not text embedders): zero-shot image classification, as the hub tags them
ZERO_SHOT_IMAGE_ARCHITECTURES = ("CLIPModel", "SiglipModel")
# speech encoder-decoders (a *ForConditionalGeneration suffix, but audio in): speech recognition
SPEECH_ARCHITECTURES = ("WhisperForConditionalGeneration",)
SEQUENCE_CLASSIFICATION = "ForSequenceClassification"
README_BYTES = 64 * 1024  # the front matter is at the top; a long model card is not read whole
FRONT_MATTER = re.compile(r"\A\ufeff?---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.S)


@dataclass(frozen=True)
class Evidence:
    """What a model's files (or its hub page) say about its task; JSON-able (the hub record)."""

    where: str  # the directory read, or "hub <repo>@<revision>"
    pipeline_tag: str | None = None
    pipeline_tag_from: str = ""  # "README.md" | "the hub's model info"
    config: dict[str, Any] | None = None  # config.json
    sentence_transformers: str | None = None  # the sentence-transformers file found (modules.json, ...)
    sentence_transformers_type: str | None = None  # config_sentence_transformers.json's model_type (CrossEncoder)
    gguf_file: str | None = None  # a GGUF checkpoint's file name


class TaskUnclear(Exception):
    """The evidence names no single supported task: `found` says what it does say, `choices` the tasks to pick from."""

    def __init__(self, found: str, choices: tuple[str, ...] = TASKS):
        self.found = found
        self.choices = choices
        super().__init__(found)


def _supported(task: str | None) -> str | None:
    return task if task in TASKS else None


def is_cross_encoder(config: dict[str, Any], evidence: Evidence) -> bool:
    """sentence-transformers' CrossEncoder marks: its config_sentence_transformers.json (model_type CrossEncoder), or
    what it writes into config.json (`sentence_transformers`: its activation; older versions CROSS_ENCODER_KEY)."""
    return evidence.sentence_transformers_type == "CrossEncoder" or CROSS_ENCODER_KEY in config or "sentence_transformers" in config


def _labels(config: dict[str, Any]) -> int:
    return len(config.get("id2label") or {}) or int(config.get("num_labels") or 2)


def _one_label_cross_encoder(evidence: Evidence) -> bool:
    config = evidence.config or {}
    sequence_classifier = any(name.endswith(SEQUENCE_CLASSIFICATION) for name in config.get("architectures") or [])
    return sequence_classifier and _labels(config) == 1 and is_cross_encoder(config, evidence)


def sequence_classification_task(config: dict[str, Any], evidence: Evidence) -> str:
    """A *ForSequenceClassification model: several labels are text-classification (an NLI cross-encoder too); one
    label is a reranker (text-ranking) when CrossEncoder marks say so, else either (a one-score classifier)."""
    labels = _labels(config)
    if labels > 1:
        return CLASSIFICATION
    if is_cross_encoder(config, evidence):
        return TEXT_RANKING
    raise TaskUnclear(
        "one output label with no sentence-transformers CrossEncoder marks: a reranker (text-ranking) or a one-score classifier",
        (TEXT_RANKING, CLASSIFICATION),
    )


def architecture_task(architecture: str, config: dict[str, Any], evidence: Evidence) -> str:
    if architecture in ZERO_SHOT_IMAGE_ARCHITECTURES:
        return ZERO_SHOT_IMAGE_CLASSIFICATION
    if architecture in SPEECH_ARCHITECTURES:
        return SPEECH_RECOGNITION
    if architecture.endswith(SEQUENCE_CLASSIFICATION):
        return sequence_classification_task(config, evidence)
    for suffix, task in TASK_OF_ARCHITECTURE_SUFFIX:
        if architecture.endswith(suffix):
            if _supported(task):
                return task
            break
    raise TaskUnclear(f"architecture {architecture} is not one hf2triton serves")


def infer_task(evidence: Evidence) -> tuple[str, str]:
    """(task, where it was inferred from); TaskUnclear when the evidence names no single supported task."""
    tag = evidence.pipeline_tag
    if tag:
        task = _supported(TASK_OF_PIPELINE_TAG.get(tag))
        if not task:
            raise TaskUnclear(f"pipeline_tag {tag!r} ({evidence.pipeline_tag_from}) is not a task hf2triton serves")
        if task == CLASSIFICATION and _one_label_cross_encoder(evidence):  # rerankers tagged text-classification (bge)
            return TEXT_RANKING, f"pipeline_tag {tag!r} in {evidence.pipeline_tag_from}, one label and CrossEncoder marks"
        return task, f"pipeline_tag {tag!r} in {evidence.pipeline_tag_from}"
    if evidence.sentence_transformers and evidence.sentence_transformers_type != "CrossEncoder":  # its labels decide
        return FEATURE_EXTRACTION, f"sentence-transformers files ({evidence.sentence_transformers}) in {evidence.where}"
    architectures = (evidence.config or {}).get("architectures") or []
    if architectures:
        tasks = {architecture_task(name, evidence.config or {}, evidence) for name in architectures}
        if len(tasks) > 1:
            raise TaskUnclear(f"architectures {architectures} say {' and '.join(sorted(tasks))}", tuple(sorted(tasks)))
        return tasks.pop(), f"architectures {architectures} in {evidence.where}/config.json"
    if evidence.gguf_file:  # transformers loads a GGUF checkpoint as a causal language model
        return GENERATION, f"the GGUF checkpoint {evidence.where}/{evidence.gguf_file}"
    raise TaskUnclear("no pipeline_tag, no sentence-transformers files and no architectures in config.json")


# ---------------------------------------------------------------- evidence of a local or package source


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: not readable JSON ({err})", "repair or remove the file, or write task: for the model") from None
    return data if isinstance(data, dict) else None


def front_matter_pipeline_tag(text: str) -> str | None:
    """The `pipeline_tag` of a model card's YAML front matter (None: no front matter, or none in it)."""
    match = FRONT_MATTER.match(text)
    if not match:
        return None
    try:
        card = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return None
    tag = card.get("pipeline_tag") if isinstance(card, dict) else None
    return tag if isinstance(tag, str) else None


def _readme_pipeline_tag(directory: Path) -> str | None:
    readme = directory / "README.md"
    if not readme.is_file():
        return None
    with readme.open("rb") as handle:
        return front_matter_pipeline_tag(handle.read(README_BYTES).decode("utf-8", errors="replace"))


def directory_evidence(directory: Path, gguf_file: str | None = None) -> Evidence:
    """What a model directory's own files say."""
    st_config = _read_json(directory / "config_sentence_transformers.json")
    st_file = next((name for name in ("modules.json", "config_sentence_transformers.json") if (directory / name).is_file()), None)
    tag = _readme_pipeline_tag(directory)
    return Evidence(
        where=str(directory),
        pipeline_tag=tag,
        pipeline_tag_from=f"{directory}/README.md" if tag else "",
        config=_read_json(directory / "config.json"),
        sentence_transformers=st_file,
        sentence_transformers_type=(st_config or {}).get("model_type"),
        gguf_file=gguf_file,
    )


# ---------------------------------------------------------------- evidence of a hub source


def hub_record_path(cache_dir: Path, repo_id: str, revision: str) -> Path:
    return cache_dir / "tasks" / f"{quote(repo_id, safe='')}@{quote(revision, safe='')}.json"


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _ask_hub(repo_id: str, revision: str, gguf_file: str | None, cache_dir: Path) -> Evidence:
    """The hub's model info (pipeline_tag, files, config), plus config.json and config_sentence_transformers.json
    when the repository has them (downloaded at the resolved commit into the cache fetch downloads into)."""
    from huggingface_hub import HfApi, hf_hub_download

    from hf2triton.pipeline.fetch import hub_endpoint, with_retries

    api = HfApi(endpoint=hub_endpoint())
    info = with_retries(lambda: api.model_info(repo_id, revision=revision), f"model_info {repo_id}")
    names = {sibling.rfilename for sibling in info.siblings or []}

    def download(name: str) -> dict[str, Any] | None:
        if name not in names:
            return None
        path = with_retries(
            lambda: hf_hub_download(repo_id, name, revision=info.sha, cache_dir=str(cache_dir), endpoint=hub_endpoint()),
            f"download {repo_id}/{name}",
        )
        return _read_json(Path(path))

    tag = info.pipeline_tag or getattr(info.card_data, "pipeline_tag", None)
    st_config = download("config_sentence_transformers.json")
    return Evidence(
        where=f"hub {repo_id}@{info.sha}",
        pipeline_tag=tag,
        pipeline_tag_from=f"the hub's model info of {repo_id}@{revision}" if tag else "",
        config=download("config.json") or (info.config if isinstance(info.config, dict) else None),
        sentence_transformers=next((n for n in ("modules.json", "config_sentence_transformers.json") if n in names), None),
        sentence_transformers_type=(st_config or {}).get("model_type"),
        gguf_file=gguf_file,
    )


def hub_evidence(repo_id: str, revision: str, gguf_file: str | None, cache_dir: Path) -> Evidence:
    """The hub's answer for repo@revision: the record of an earlier run when there is one, else asked now and kept."""
    record = hub_record_path(cache_dir, repo_id, revision)
    try:  # gguf_file is the config's, not the hub's: a changed one applies to the kept answer
        return dataclasses.replace(Evidence(**json.loads(record.read_text())), gguf_file=gguf_file)
    except (OSError, ValueError, TypeError):  # none kept, unreadable, or written by another version: asked now
        pass
    if hub_offline():
        raise UserError(
            f"the hub is offline (HF_HUB_OFFLINE) and no earlier answer for {repo_id}@{revision} is kept in {record.parent}",
            "write task: for the model",
        )
    from hf2triton.pipeline.fetch import explain_hub_error

    try:
        evidence = _ask_hub(repo_id, revision, gguf_file, cache_dir)
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - every failure is explained
        raise explain_hub_error(err, repo_id, revision) from None
    atomic_write_json(record, dataclasses.asdict(evidence))
    return evidence


# ---------------------------------------------------------------- a config entry


def source_evidence(source: Source, revision: str, gguf_file: str | None, cache_dir: Path, where: str) -> Evidence:
    """What a model's source says about it (a local path that does not exist is refused naming `where`)."""
    from hf2triton.pipeline.sources import resolve_local_path

    if source.is_hub:
        return hub_evidence(source.value, revision, gguf_file, cache_dir)
    path = resolve_local_path(source, where)
    if path.is_file():  # a .gguf file
        return directory_evidence(path.parent, path.name)
    return directory_evidence(path, gguf_file)


def infer_entry_task(entry: dict[str, Any], source: Source, cache_dir: Path, where: str) -> tuple[str, str]:
    """(task, where from) of a config model entry without `task:`; a UserError naming the entry when it is unclear."""
    try:
        evidence = source_evidence(source, entry["revision"], entry.get("gguf_file"), cache_dir, f"{where}.source")
        return infer_task(evidence)
    except UserError as err:
        raise UserError(f"{where}.task: missing, and inferring it failed: {err.message}", f"write task: for it, or {err.fix}") from None
    except TaskUnclear as unclear:
        raise UserError(
            f"{where}.task: missing, and the task of {entry['name']} ({entry['source']}) is unclear: {unclear.found}",
            "write task: " + " or task: ".join(unclear.choices) + " for it",
        ) from None
