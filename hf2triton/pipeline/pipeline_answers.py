"""transformers' own pipelines as validation's reference for the tasks whose served answer is the pipeline's JSON
(token-classification: entities; fill-mask: candidates), and how two such answers compare; text-ranking's reference
(transformers has no rerank pipeline): the model in-process on the tokenizer's pair encoding, sigmoid of its logit;
feature-extraction's (sentence-transformers is not installed): its encode() re-written from its source in plain torch."""

from __future__ import annotations

import functools
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from hf2triton.pipeline.image_probes import ZERO_SHOT_LABELS, probe_images
from hf2triton.serving import interface

# The pipeline's JSON per task: (served output tensor, what one item of its list is called in the report)
JSON_ANSWERS = {
    interface.TOKEN_CLASSIFICATION: (interface.ENTITIES, "entities"),
    interface.FILL_MASK: (interface.CANDIDATES, "candidates"),
    **{task: (interface.LABELS, "labels") for task in interface.IMAGE_TASKS},  # per image its labels (image_probes.py)
}
SCORE_TOLERANCE = 1e-3  # served scores vs the pipeline's
MASK = "{mask}"  # fill-mask probes: replaced by the model's own mask token


def entity_lists(values: np.ndarray) -> list[list[dict[str, Any]]]:
    """A JSON answer (one JSON list per text: a tagger's entities, fill-mask's candidates) as Python."""
    return [json.loads(v) for v in values.reshape(-1)]


def compare_entities(served: list[list[dict]], reference: list[list[dict]], ranked: bool = False) -> dict[str, Any]:
    """Served entities (candidates) vs the pipeline's: the same items in the same order, the same keys in the same
    order and the same values, scores within SCORE_TOLERANCE. `ranked` (lists sorted by score: fill-mask's
    candidates): items whose scores tie within the tolerance may come in either order, and at the end of the list either
    of the tied items may be the one kept -- float16 on a GPU rounds many of a large vocabulary's small probabilities
    to the same value, and which of those the top-k keeps is then the sort's choice, not the model's."""
    diff, differing = 0.0, []
    for index, (mine, theirs) in enumerate(zip(served, reference)):
        same = len(mine) == len(theirs)
        for a, b in zip(mine, theirs):
            if interface.SCORE in a and interface.SCORE in b:
                diff = max(diff, abs(float(a[interface.SCORE]) - float(b[interface.SCORE])))
        if same and ranked:
            same = all(_tied_match(item, theirs) for item in mine) and all(_tied_match(item, mine) for item in theirs)
        elif same:
            same = all(list(a) == list(b) and all(a[k] == b[k] for k in a if k != interface.SCORE) for a, b in zip(mine, theirs))
        if not same:
            differing.append(index)
    ok = not differing and len(served) == len(reference) and diff < SCORE_TOLERANCE
    figures = {
        "texts": len(reference),
        "entities": sum(map(len, reference)),
        "max_score_diff": round(diff, 6),
        "texts_differing": differing,
    }
    return {"ok": ok, **figures}


def _tied_match(item: dict, others: list[dict]) -> bool:
    """`item` is in `others` (the same fields, score within SCORE_TOLERANCE), or ties with the last of them (the
    item the top-k cut off there instead)."""
    score = float(item[interface.SCORE])

    def fields(entry: dict) -> list:
        return [(k, v) for k, v in entry.items() if k != interface.SCORE]

    found = any(fields(o) == fields(item) and abs(float(o[interface.SCORE]) - score) < SCORE_TOLERANCE for o in others)
    return found or abs(float(others[-1][interface.SCORE]) - score) < SCORE_TOLERANCE


@functools.lru_cache(maxsize=1)
def _pipeline(task: str, model_dir: str, device: str, dtype: str):
    from transformers import pipeline

    from hf2triton.serving.runtimes.pytorch import torch_dtype

    return pipeline(task, model=model_dir, device=device, dtype=torch_dtype(dtype, device))


def _as_served(answers: list[list[dict[str, Any]]]) -> np.ndarray:
    from hf2triton.serving.tasks.token_classification import entities_json

    return np.array([entities_json(answer).encode("utf-8") for answer in answers], dtype=np.object_)


def pipeline_entities(
    model_dir: str,
    texts: list[str],
    device: str = "cpu",
    strategy: str = interface.DEFAULT_AGGREGATION_STRATEGY,
    dtype: str = "auto",
    stride: int = interface.NO_STRIDE,
) -> np.ndarray:
    """`transformers.pipeline("token-classification")` over `texts` in-process (the served model's device and dtype),
    one JSON list per text (BYTES, as served); with a stride, long texts in overlapping windows."""
    windows = {} if stride == interface.NO_STRIDE else {"stride": stride}
    return _as_served(_pipeline(interface.TOKEN_CLASSIFICATION, model_dir, device, dtype)(texts, aggregation_strategy=strategy, **windows))


def pipeline_candidates(
    model_dir: str, texts: list[str], device: str = "cpu", top_k: int = interface.DEFAULT_FILL_MASK_TOP_K, dtype: str = "auto"
) -> np.ndarray:
    """`transformers.pipeline("fill-mask")` over `texts` (one mask token each) in-process, one JSON list of
    candidates per text (BYTES, as served)."""
    answers = _pipeline(interface.FILL_MASK, model_dir, device, dtype)(texts, top_k=top_k)
    return _as_served([answers] if len(texts) == 1 else answers)  # one text: the pipeline answers its list alone


def pipeline_image_answers(
    task: str, model_dir: str, images: list[bytes], device: str = "cpu", dtype: str = "auto", **options: Any
) -> dict[str, np.ndarray]:
    """`transformers.pipeline(task)` over `images` (encoded; opened with Pillow, the pipeline converts them) in-process,
    one JSON list of {label, score} per image (BYTES, as served). `options`: the pipeline's (top_k, function_to_apply;
    candidate_labels, hypothesis_template)."""
    from PIL import Image

    if task == interface.ZERO_SHOT_IMAGE_CLASSIFICATION:
        options.setdefault(interface.CANDIDATE_LABELS, list(ZERO_SHOT_LABELS))
        options[interface.CANDIDATE_LABELS] = list(options[interface.CANDIDATE_LABELS])
    pictures = [Image.open(io.BytesIO(image)) for image in images]
    answers = _pipeline(task, model_dir, device, dtype)(pictures, **options)
    return {interface.LABELS: _as_served(answers)}


@functools.lru_cache(maxsize=1)
def _dual_encoder(model_dir: str, device: str, dtype: str):
    from transformers import AutoImageProcessor, AutoModelForZeroShotImageClassification, AutoTokenizer

    from hf2triton.serving.runtimes.pytorch import torch_dtype

    model = AutoModelForZeroShotImageClassification.from_pretrained(model_dir, dtype=torch_dtype(dtype, device)).to(device).eval()
    return model, AutoImageProcessor.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)


def dual_encoder_embeddings(
    model_dir: str, rows: list[Any], texts: bool, device: str = "cpu", dtype: str = "auto"
) -> dict[str, np.ndarray]:
    """A zero-shot model's embeddings' reference, each row alone in-process: an image (encoded) opened as the pipeline
    opens it (EXIF orientation, RGB) through the image processor and `get_image_features`, or a text tokenised as
    the pipeline tokenises its hypotheses (SigLIP: padded to 64 tokens; CLIP: cut to its context) through
    `get_text_features`; L2-normalised (as served: embedding FP32, prompt_tokens)."""
    import torch
    from PIL import Image, ImageOps

    model, processor, tokenizer = _dual_encoder(model_dir, device, dtype)
    siglip = "siglip" in model.config.model_type
    context = model.config.text_config.max_position_embeddings
    vectors, tokens = [], []
    for row in rows:
        with torch.inference_mode():
            if texts:
                length = {"padding": "max_length", "max_length": 64} if siglip else {"max_length": context}
                batch = tokenizer([row], return_tensors="pt", truncation=True, **length).to(device)
                features = model.get_text_features(**batch)
                tokens.append(int(batch["attention_mask"].sum()) if "attention_mask" in batch else len(tokenizer(row)["input_ids"]))
            else:
                image = ImageOps.exif_transpose(Image.open(io.BytesIO(row))).convert("RGB")
                pixels = processor(images=[image], return_tensors="pt")["pixel_values"].to(device=device, dtype=model.dtype)
                features = model.get_image_features(pixel_values=pixels)
                tokens.append(0)
        vectors.append(torch.nn.functional.normalize(features.float(), dim=-1)[0].cpu().numpy())
    return {interface.EMBEDDING: np.stack(vectors).astype(np.float32), interface.PROMPT_TOKENS: np.array(tokens, dtype=np.int32)}


def pipeline_answers(
    task: str, model_dir: str, texts: list[str], device: str, dtype: str, stride: int = interface.NO_STRIDE
) -> dict[str, np.ndarray]:
    """The pipeline's default answer for a JSON-answer task, as the served output tensor (a tagger: with its stride)."""
    if task == interface.TOKEN_CLASSIFICATION:
        return {JSON_ANSWERS[task][0]: pipeline_entities(model_dir, texts, device, dtype=dtype, stride=stride)}
    if task in interface.IMAGE_TASKS:  # `texts`: encoded images
        return pipeline_image_answers(task, model_dir, texts, device, dtype)
    return {JSON_ANSWERS[task][0]: pipeline_candidates(model_dir, texts, device, dtype=dtype)}


def probe_texts(task: str, model_dir: str, probes: list[str]) -> list[str]:
    """Validation's probes for the model: fill-mask's with the tokenizer's own mask token; an image task's synthetic
    images (encoded, in place of the texts); speech's synthetic audio files."""
    if task in interface.IMAGE_TASKS:
        return probe_images()
    if task == interface.SPEECH_RECOGNITION:
        from hf2triton.pipeline.audio_probes import probe_audios

        return probe_audios()
    if task != interface.FILL_MASK:
        return probes
    from transformers import AutoTokenizer

    mask = AutoTokenizer.from_pretrained(model_dir).mask_token
    return [probe.replace(MASK, mask) for probe in probes]


def parity_texts(task: str, model_dir: str, probes: list[str]) -> list[str]:
    """The parity gate's probes for the model: fill-mask's each with its second word masked (a mask in every text)."""
    if task == interface.FILL_MASK:
        probes = [" ".join(words[:1] + [MASK] + words[2:]) for words in (probe.split(" ") for probe in probes)]
    return probe_texts(task, model_dir, probes)


@functools.lru_cache(maxsize=1)
def _cross_encoder(model_dir: str, device: str, dtype: str):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from hf2triton.serving.runtimes.pytorch import torch_dtype

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch_dtype(dtype, device)).to(device).eval()
    return AutoTokenizer.from_pretrained(model_dir), model


def cross_encoder_scores(model_dir: str, query: str, texts: list[str], device: str = "cpu", dtype: str = "auto") -> dict[str, np.ndarray]:
    """text-ranking's reference, as sentence-transformers' CrossEncoder computes it for a one-label model: the
    (query, text) pairs through the tokenizer's __call__ (padded, truncated longest-first to the model's context), the
    model in-process, the logit through the activation its config names (sigmoid where none); with the tokens each pair
    became (as served: score FP32, prompt_tokens)."""
    import torch

    from hf2triton.serving.tasks.text_ranking import score_activation

    tokenizer, model = _cross_encoder(model_dir, device, dtype)
    limits = (getattr(model.config, "max_position_embeddings", None), tokenizer.model_max_length)
    context = min(int(x) for x in limits if isinstance(x, (int, float)) and 0 < x < 1e9)
    batch = tokenizer([query] * len(texts), texts, padding=True, truncation=True, max_length=context, return_tensors="pt").to(device)
    with torch.inference_mode():
        logits = model(**batch).logits.float()
        scores = score_activation(model.config)(logits[:, 0]).cpu().numpy().astype(np.float32)
    return {interface.SCORE: scores, interface.PROMPT_TOKENS: batch["attention_mask"].sum(1).cpu().numpy().astype(np.int32)}


def compare_scores(served: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict[str, Any]:
    """text-ranking: served relevance scores vs the reference's, within 1e-3, the same ranking and the same token counts.
    The same ranking up to ties: no two documents the reference scores more than 1e-5 apart come back in the other order
    (documents it scores equal -- the same text twice -- may come back a few 1e-7 apart from another batch's padding)."""
    mine, theirs = served[interface.SCORE].reshape(-1), reference[interface.SCORE].reshape(-1)
    diff = float(np.abs(mine - theirs).max()) if len(theirs) else 0.0
    same_tokens = served[interface.PROMPT_TOKENS].reshape(-1).tolist() == reference[interface.PROMPT_TOKENS].reshape(-1).tolist()
    reversed_pairs = (theirs[:, None] - theirs[None, :] > 1e-5) & (mine[:, None] < mine[None, :]) if len(mine) == len(theirs) else True
    same_order = not np.any(reversed_pairs)
    figures = {"texts": len(theirs), "max_score_diff": round(diff, 7), "same_ranking": same_order, "same_tokens": same_tokens}
    return {"ok": len(mine) == len(theirs) and diff < 1e-3 and same_order and same_tokens, **figures}


def _st_json(model_dir: str, name: str) -> Any:
    path = Path(model_dir) / name
    return json.loads(path.read_text()) if path.is_file() else None


@functools.lru_cache(maxsize=1)
def _sentence_transformer(model_dir: str, device: str, dtype: str):
    """The model as sentence-transformers' SentenceTransformer loads it, written from its source (it is not installed):
    the transformers model, its Pooling config as `Pooling(**config)` reads it, whether Normalize follows, its prompts,
    max_seq_length and do_lower_case. No modules.json: mean pooling, normalised (hf2triton's rule for such models)."""
    from transformers import AutoModel, AutoTokenizer

    from hf2triton.serving.runtimes.pytorch import torch_dtype

    model = AutoModel.from_pretrained(model_dir, dtype=torch_dtype(dtype, device)).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    modules = _st_json(model_dir, "modules.json")
    modes = ("cls_token", "max_tokens", "mean_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")
    defaults = {f"pooling_mode_{mode}": mode == "mean_tokens" for mode in modes}  # Pooling.__init__'s
    pooling = {**defaults, "include_prompt": True}
    pooling_dir = next((m["path"] for m in modules or [] if m["type"].endswith("Pooling")), "1_Pooling")
    pooling.update(_st_json(model_dir, f"{pooling_dir}/config.json") or {})
    if pooling.get("pooling_mode"):  # Pooling's string form overrides every flag
        short = {"cls": "cls_token", "max": "max_tokens", "mean": "mean_tokens", "weightedmean": "weightedmean_tokens"}
        mode = str(pooling["pooling_mode"]).lower()
        pooling.update({key: key == f"pooling_mode_{short.get(mode, mode)}" for key in defaults})
    settings = (_st_json(model_dir, "config_sentence_transformers.json") or {}) if modules else {}
    prompts = {"query": "", "document": ""}
    prompts.update({k: v for k, v in (settings.get("prompts") or {}).items() if v or k not in prompts})
    bert_config = _st_json(model_dir, "sentence_bert_config.json") or {}
    limits = (getattr(model.config, "max_position_embeddings", None), tokenizer.model_max_length)
    max_length = bert_config.get("max_seq_length") or min(int(x) for x in limits if isinstance(x, (int, float)) and 0 < x < 1e9)
    facts = {
        "pooling": pooling,
        "normalize": modules is None or any(m["type"].endswith("Normalize") for m in modules),
        "prompts": prompts,
        "default_prompt_name": settings.get("default_prompt_name") or None,
        "max_length": int(max_length),
        "lower_case": bool(bert_config.get("do_lower_case")),
        "strip": modules is not None,
    }
    return tokenizer, model, facts


def _st_pool(torch, token_embeddings, attention_mask, pooling: dict[str, Any]):
    """sentence-transformers' Pooling.forward (models/Pooling.py), its formulas as they are there."""
    vectors = []
    mask = attention_mask.unsqueeze(-1).expand(token_embeddings.size()).to(token_embeddings.dtype)
    if pooling["pooling_mode_cls_token"]:
        vectors.append(token_embeddings[:, 0])
    if pooling["pooling_mode_max_tokens"]:
        vectors.append(token_embeddings.masked_fill(mask == 0, -1e9).max(1)[0])
    if pooling["pooling_mode_mean_tokens"] or pooling["pooling_mode_mean_sqrt_len_tokens"]:
        total, count = (token_embeddings * mask).sum(1), mask.sum(1).clamp(min=1e-9)
        if pooling["pooling_mode_mean_tokens"]:
            vectors.append(total / count)
        if pooling["pooling_mode_mean_sqrt_len_tokens"]:
            vectors.append(total / torch.sqrt(count))
    if pooling["pooling_mode_weightedmean_tokens"]:
        weights = torch.arange(1, token_embeddings.shape[1] + 1, device=mask.device).unsqueeze(0).unsqueeze(-1).to(mask.dtype) * mask
        vectors.append((token_embeddings * weights).sum(1) / weights.sum(1).clamp(min=1e-9))
    if pooling["pooling_mode_lasttoken"]:
        values, indices = attention_mask.flip(1).max(1)
        seq_len = token_embeddings.shape[1]
        gather = (seq_len - torch.where(values == 0, seq_len - 1, indices) - 1).view(-1, 1, 1).expand(-1, 1, token_embeddings.shape[2])
        vectors.append(torch.gather(token_embeddings * mask, 1, gather).squeeze(1))
    return torch.cat(vectors, 1)


def sentence_embeddings(
    model_dir: str, texts: list[str], device: str = "cpu", dtype: str = "auto", prompt_name: str | None = None
) -> dict[str, np.ndarray]:
    """feature-extraction's reference, as sentence-transformers' `encode(texts, prompt_name=...)` computes it, written
    from its source (not installed) and independent of the serving engine: the prompt (else the default prompt)
    prepended, the text stripped (lowercased where configured), tokenised and run alone (no padding: each text's own
    answer), the prompt's tokens masked out for include_prompt false, Pooling's formulas, Normalize where the model
    lists it; with the tokens each text became (as served: embedding FP32, prompt_tokens)."""
    import torch

    tokenizer, model, facts = _sentence_transformer(model_dir, device, dtype)
    name = facts["default_prompt_name"] if prompt_name is None else prompt_name
    prompt = facts["prompts"][name] if name is not None else ""

    def tokenize(text: str):
        text = text.strip() if facts["strip"] else text
        text = text.lower() if facts["lower_case"] else text
        return tokenizer([text], padding=True, truncation="longest_first", max_length=facts["max_length"], return_tensors="pt").to(device)

    prompt_length = None
    if prompt:
        ids = tokenize(prompt)["input_ids"]
        prompt_length = ids.shape[-1] - (1 if ids[0, -1].item() in tokenizer.all_special_ids else 0)
    vectors, tokens = [], []
    for text in texts:
        features = tokenize(prompt + text)
        with torch.inference_mode():
            states = model(**features).last_hidden_state
        mask = features["attention_mask"].clone()
        tokens.append(int(mask.sum()))
        if prompt_length is not None and not facts["pooling"]["include_prompt"]:
            mask[:, :prompt_length] = 0
        vector = _st_pool(torch, states, mask, facts["pooling"])
        if facts["normalize"]:
            vector = torch.nn.functional.normalize(vector, p=2, dim=1)
        vectors.append(vector[0].float().cpu().numpy())
    return {interface.EMBEDDING: np.stack(vectors).astype(np.float32), interface.PROMPT_TOKENS: np.array(tokens, dtype=np.int32)}


def compare_embeddings(served: dict[str, np.ndarray], reference: dict[str, np.ndarray], floor: float) -> dict[str, Any]:
    """Served embeddings vs the reference's: the same width, cosine >= `floor`, and lengths as close as that cosine
    lets the vectors be (within sqrt(2 (1 - floor)) of each other: 4.5 % at 0.999, where float16 on a GPU answers to
    float32), which a vector normalised that should not be -- or the reverse -- is not: it differs in length only."""
    mine, theirs = served[interface.EMBEDDING].astype(np.float64), reference[interface.EMBEDDING].astype(np.float64)
    if mine.shape != theirs.shape:
        return {"ok": False, "texts": len(theirs), "cosine_min": 0.0, "cosine_mean": 0.0, "norm_diff_max": 1.0, "floor": floor,
                "width": f"{mine.shape[-1]} vs {theirs.shape[-1]}"}  # fmt: skip
    norms_s, norms_r = np.linalg.norm(mine, axis=1), np.linalg.norm(theirs, axis=1)
    cos = (mine * theirs).sum(1) / np.maximum(norms_s * norms_r, 1e-30)
    norm_diff = float((np.abs(norms_s - norms_r) / np.maximum(norms_r, 1e-30)).max())
    figures = {"texts": len(cos), "cosine_min": round(float(cos.min()), 6), "cosine_mean": round(float(cos.mean()), 6),
               "norm_diff_max": round(norm_diff, 7), "floor": floor}  # fmt: skip
    return {"ok": bool(cos.min() >= floor) and norm_diff <= math.sqrt(2 * (1 - floor)), **figures}


def pipeline_text2text(task: str, model_dir: str, texts: list[str], device: str, dtype: str, max_new_tokens: int) -> list[str]:
    """`transformers.pipeline(task)` (text2text-generation, summarization, translation...) over `texts` in-process,
    each text's answer (its generated_text / summary_text / translation_text)."""
    answers = _pipeline(task, model_dir, device, dtype)(texts, max_new_tokens=max_new_tokens)
    return [next(v for k, v in answer.items() if k.endswith("_text")) for answer in answers]
