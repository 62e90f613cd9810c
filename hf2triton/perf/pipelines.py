"""The load and the yardstick of the tasks whose reference is transformers' own `pipeline(task)`: what each request
carries (a reranker's query, a masked word; an image task's encoded photos, speech's encoded audio), and the pipeline's
throughput in-process on the served device, one item at a time (the loop a user writes first) and batched
(`pipeline(items, batch_size=B)`, its best).

bench compares the served model with both: issue 43's goals are served >= 3x the pipeline's batch-1 loop and >= 0.9x
its best batched throughput.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from hf2triton.perf.loadgen import percentiles
from hf2triton.serving import interface

log = logging.getLogger(__name__)

PIPELINE_TASKS = (
    interface.TOKEN_CLASSIFICATION,
    interface.FILL_MASK,
    interface.TEXT_RANKING,
    interface.CLASSIFICATION,
    interface.TEXT2TEXT,
    *interface.NON_TEXT_TASKS,
)
RANKING_QUERY = "Which city is the capital of France, and what is it known for?"
PIPELINE_BATCHES = (1, 8, 32)  # and the served max_batch_size: the pipeline's best batch is taken over these
MIN_SECONDS, MIN_CALLS, WARMUP_CALLS = 3.0, 5, 3
MEDIA_ROWS = 32  # distinct synthetic files an image or speech load cycles through
IMAGE_SIZE = (640, 480)  # a photo's size: the processor resizes it, served and in the pipeline alike
AUDIO_SECONDS, AUDIO_RATE = 5.0, 16000  # an utterance, as WAV at Whisper's rate


@dataclasses.dataclass(frozen=True)
class TaskLoad:
    """What a bench request of this task sends: its rows (texts, documents for a reranker, or encoded image / audio
    files), the tensor they go in, the options every request carries, and what an item is."""

    rows: list[Any]
    options: dict[str, Any]
    items: str = "texts"
    primary: str = interface.TEXT

    @property
    def encoded(self) -> list[bytes]:
        return [row.encode() if isinstance(row, str) else row for row in self.rows]


def task_load(task: str, texts: list[str], model_dir: str) -> TaskLoad:
    """The corpus shaped for `task`: a fill-mask text gets its middle word masked (the task needs exactly one mask
    token), a reranker's documents are scored against one query. A pipeline task keeps only the texts that fit the
    model's context (with the query): the pipeline does not truncate them, and served and pipeline get the same texts.
    An image or speech task's load is synthetic files instead (media_load)."""
    if task in interface.NON_TEXT_TASKS:
        return media_load(task)
    if task not in PIPELINE_TASKS:
        return TaskLoad(texts, {})
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    query = RANKING_QUERY if task == interface.TEXT_RANKING else None
    if task == interface.FILL_MASK:
        texts = [_masked(text, tokenizer.mask_token) for text in texts]
    encoded = tokenizer([query] * len(texts), texts) if query is not None else tokenizer(texts)
    limit = _context(model_dir, tokenizer)
    fitting = [text for text, ids in zip(texts, encoded["input_ids"]) if len(ids) <= limit]
    if not fitting:
        raise ValueError(f"no bench text fits {model_dir}'s context of {limit} tokens")
    return TaskLoad(fitting, {interface.QUERY: query} if query is not None else {}, "documents" if query is not None else "texts")


def media_load(task: str) -> TaskLoad:
    """MEDIA_ROWS distinct files: JPEG photos of IMAGE_SIZE (zero-shot: with validation's candidate labels), or
    AUDIO_SECONDS of WAV per audio (the bench's items are then audios of that length)."""
    if task == interface.SPEECH_RECOGNITION:
        from hf2triton.pipeline.audio_probes import encoded_audio, synthetic_audio

        rows = [encoded_audio(synthetic_audio(AUDIO_SECONDS, AUDIO_RATE, seed), AUDIO_RATE, "WAV") for seed in range(MEDIA_ROWS)]
        return TaskLoad(rows, {}, f"audios ({AUDIO_SECONDS:g} s each)", interface.AUDIO)
    from hf2triton.pipeline.image_probes import encoded, synthetic_image, validation_options

    rows = [encoded(synthetic_image(*IMAGE_SIZE, seed % 4), "JPEG") for seed in range(MEDIA_ROWS)]
    return TaskLoad(rows, validation_options(task) or {}, "images", interface.IMAGE)


def _context(model_dir: str, tokenizer) -> int:
    """The tokens a text may take: the tokenizer's limit, and the model's position table where it has one."""
    config = Path(model_dir) / "config.json"
    positions = json.loads(config.read_text()).get("max_position_embeddings", 0) if config.is_file() else 0
    return min(n for n in (tokenizer.model_max_length, positions) if 0 < n < 1_000_000)


def _masked(text: str, mask: str) -> str:
    words = text.split()
    words[len(words) // 2] = mask
    return " ".join(words)


def _pipeline(task: str, model_dir: str, device: str, dtype: str):
    """`pipeline(task)` on the served device in the served dtype (float16 on a GPU: a float32 pipeline would be the
    slower yardstick)."""
    from transformers import pipeline

    from hf2triton.serving.runtimes.pytorch import torch_dtype

    common = {"model": model_dir, "device": device, "dtype": torch_dtype(dtype, device)}
    if task == interface.TEXT_RANKING:  # a cross-encoder: the pair's one logit through sigmoid, as CrossEncoder answers
        return pipeline("text-classification", function_to_apply="sigmoid", **common)
    if task == interface.TOKEN_CLASSIFICATION:
        return pipeline(task, aggregation_strategy=interface.DEFAULT_AGGREGATION_STRATEGY, **common)
    return pipeline(task, **common)


def _inputs(load: TaskLoad, model_dir: str) -> tuple[list[Any], dict[str, Any]]:
    """The pipeline's inputs and call options for the load: a reranker's pairs; images and audio decoded first (the
    image pipeline takes no bytes, the speech one decodes files only with ffmpeg), so its figure leaves out the
    decoding the served model does per request."""
    query = load.options.get(interface.QUERY)
    if query is not None:
        return [{"text": query, "text_pair": text} for text in load.rows], {}
    if load.primary == interface.IMAGE:
        from hf2triton.serving.images import decode_images

        images = decode_images(np.array(load.rows, dtype=np.object_), interface.DEFAULTS.max_image_pixels)
        labels = load.options.get(interface.CANDIDATE_LABELS)
        return images, ({"candidate_labels": list(labels)} if labels else {})
    if load.primary == interface.AUDIO:
        from transformers import AutoFeatureExtractor

        from hf2triton.serving.audio import decode_audio

        rate = int(AutoFeatureExtractor.from_pretrained(model_dir).sampling_rate)
        return [{"raw": decode_audio(row, rate, AUDIO_SECONDS + 1), "sampling_rate": rate} for row in load.rows], {}
    return list(load.rows), {}


def pipeline_throughput(
    task: str, model_dir: str, device: str, dtype: str, load: TaskLoad, sizes: list[int], seconds: float
) -> dict[str, Any]:
    """Items/s of `pipeline(task)` in this process: batch 1 = one call per text (the pipeline's own loop), batch B =
    `pipe(chunk of B, batch_size=B)`; each cell a closed loop of at least MIN_SECONDS and MIN_CALLS."""
    pipe = _pipeline(task, model_dir, device, dtype)
    inputs, call = _inputs(load, model_dir)
    cells = {}
    for batch in sizes:
        chunks = [inputs[i : i + batch] for i in range(0, len(inputs) - batch + 1, batch)] or [inputs[:batch]]
        for chunk in chunks[:WARMUP_CALLS]:
            pipe(_fresh(chunk), batch_size=batch, **call)
        calls, items, latencies, started = 0, 0, [], time.perf_counter()
        while calls < MIN_CALLS or time.perf_counter() - started < max(seconds, MIN_SECONDS):
            chunk = _fresh(chunks[calls % len(chunks)])
            call_started = time.perf_counter()
            pipe(chunk, batch_size=batch, **call)
            latencies.append(time.perf_counter() - call_started)
            items, calls = items + len(chunk), calls + 1
        elapsed = time.perf_counter() - started
        cells[str(batch)] = _cell(batch, items, elapsed, latencies)
        log.info("in-process pipeline('%s') batch %d: %.1f %s/s", task, batch, cells[str(batch)]["items_per_s"], load.items)
    del pipe
    return cells


def _fresh(chunk: list[Any]) -> list[Any]:
    """The chunk with its dict inputs copied: the speech pipeline pops "raw" and "sampling_rate" from the dict it is
    given, so a dict passed twice would be refused the second time (the arrays are shared, not copied)."""
    return [dict(item) if isinstance(item, dict) else item for item in chunk]


def _cell(batch: int, items: int, elapsed: float, latencies: list[float]) -> dict[str, Any]:
    return {"batch": batch, "calls": len(latencies), "items_per_s": round(items / elapsed, 2), "latency_ms": percentiles(latencies)}


def pipeline_generation(
    task: str, model_dir: str, device: str, dtype: str, plan: list[tuple[bytes, int]], count_tokens, batches: tuple[int, ...]
) -> dict[str, Any]:
    """Generated tokens/s of `pipeline(task)` (text2text-generation) over the bench's prompts, greedy: batch 1 = one
    call per prompt with its own max_new_tokens, batch B = chunks of B (max_new_tokens: the chunk's largest)."""
    pipe = _pipeline(task, model_dir, device, dtype)
    prompts = [(prompt.decode(), max_new_tokens) for prompt, max_new_tokens in plan]
    # greedy, one beam, as the served stream decodes (the text2text pipeline's own default is 4 beams)
    greedy = {"do_sample": False, "num_beams": 1}
    pipe(prompts[0][0], max_new_tokens=4, **greedy)  # warm-up
    cells = {}
    for batch in batches:
        started, tokens, latencies = time.perf_counter(), 0, []
        for start in range(0, len(prompts), batch):
            chunk = prompts[start : start + batch]
            call_started = time.perf_counter()
            answers = pipe([p for p, _ in chunk], batch_size=batch, max_new_tokens=max(m for _, m in chunk), **greedy)
            latencies.append(time.perf_counter() - call_started)
            answers = [answer[0] if isinstance(answer, list) else answer for answer in answers]  # a list per input, or a dict
            tokens += count_tokens([answer["generated_text"].encode() for answer in answers])
        elapsed = time.perf_counter() - started
        cells[str(batch)] = _cell(batch, tokens, elapsed, latencies)
        log.info("in-process pipeline('%s') batch %d: %.1f tokens/s", task, batch, cells[str(batch)]["items_per_s"])
    del pipe
    return cells


def pipeline_ratios(result: dict[str, Any], cells_key: str = "served") -> dict[str, Any]:
    """The served cells (`cells_key`: a streaming model's "stream") against the pipeline: each protocol's best cell at
    each concurrency over the pipeline's batch-1 loop (goal >= 3) and its best batch (goal >= 0.9)."""
    pipeline = result["raw"]["pipeline"]
    loop = pipeline["1"]["items_per_s"]
    batched = max(cell["items_per_s"] for cell in pipeline.values())
    out: dict[str, Any] = {"pipeline_batch1_items_per_s": loop, "pipeline_best_batched_items_per_s": batched}
    for protocol in result["bench"]["protocols"]:
        cells = [c for c in result[cells_key] if c.get("protocol", "grpc") == protocol]  # streams: gRPC only
        for concurrency in sorted({c["concurrency"] for c in cells}):
            best = max((c for c in cells if c["concurrency"] == concurrency), key=lambda c: c["items_per_s"])
            key = f"{protocol}_c{concurrency}"
            out[key] = {
                "served_items_per_s": best["items_per_s"],
                "request_texts": best.get("request_texts", 1),
                "vs_pipeline_batch1": round(best["items_per_s"] / loop, 3),
                "vs_pipeline_best_batched": round(best["items_per_s"] / batched, 3),
            }
    return out
