"""transformers' own pipelines as validation's reference for the tasks whose served answer is the pipeline's JSON
(token-classification: entities; fill-mask: candidates), and how two such answers compare; text-ranking's reference
(transformers has no rerank pipeline): the model in-process on the tokenizer's pair encoding, sigmoid of its logit."""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

from hf2triton.serving import interface

# The pipeline's JSON per task: (served output tensor, what one item of its list is called in the report)
JSON_ANSWERS = {interface.TOKEN_CLASSIFICATION: (interface.ENTITIES, "entities"), interface.FILL_MASK: (interface.CANDIDATES, "candidates")}
MASK = "{mask}"  # fill-mask probes: replaced by the model's own mask token


def entity_lists(values: np.ndarray) -> list[list[dict[str, Any]]]:
    """A JSON answer (one JSON list per text: a tagger's entities, fill-mask's candidates) as Python."""
    return [json.loads(v) for v in values.reshape(-1)]


def compare_entities(served: list[list[dict]], reference: list[list[dict]]) -> dict[str, Any]:
    """Served entities (candidates) vs the pipeline's: the same items in the same order, the same keys in the same
    order and the same values, scores within 1e-3."""
    diff, differing = 0.0, []
    for index, (mine, theirs) in enumerate(zip(served, reference)):
        same = len(mine) == len(theirs)
        for a, b in zip(mine, theirs):
            same = same and list(a) == list(b) and all(a[k] == b[k] for k in a if k != interface.SCORE)
            if interface.SCORE in a and interface.SCORE in b:
                diff = max(diff, abs(float(a[interface.SCORE]) - float(b[interface.SCORE])))
        if not same:
            differing.append(index)
    ok = not differing and len(served) == len(reference) and diff < 1e-3
    figures = {
        "texts": len(reference),
        "entities": sum(map(len, reference)),
        "max_score_diff": round(diff, 6),
        "texts_differing": differing,
    }
    return {"ok": ok, **figures}


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


def pipeline_answers(
    task: str, model_dir: str, texts: list[str], device: str, dtype: str, stride: int = interface.NO_STRIDE
) -> dict[str, np.ndarray]:
    """The pipeline's default answer for a JSON-answer task, as the served output tensor (a tagger: with its stride)."""
    if task == interface.TOKEN_CLASSIFICATION:
        return {JSON_ANSWERS[task][0]: pipeline_entities(model_dir, texts, device, dtype=dtype, stride=stride)}
    return {JSON_ANSWERS[task][0]: pipeline_candidates(model_dir, texts, device, dtype=dtype)}


def probe_texts(task: str, model_dir: str, probes: list[str]) -> list[str]:
    """Validation's probes for the model: fill-mask's with the tokenizer's own mask token."""
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
    model in-process, sigmoid of the logit; with the tokens each pair became (as served: score FP32, prompt_tokens)."""
    import torch

    tokenizer, model = _cross_encoder(model_dir, device, dtype)
    limits = (getattr(model.config, "max_position_embeddings", None), tokenizer.model_max_length)
    context = min(int(x) for x in limits if isinstance(x, (int, float)) and 0 < x < 1e9)
    batch = tokenizer([query] * len(texts), texts, padding=True, truncation=True, max_length=context, return_tensors="pt").to(device)
    with torch.inference_mode():
        logits = model(**batch).logits.float()
    scores = torch.sigmoid(logits[:, 0]).cpu().numpy().astype(np.float32)
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
