"""Probe (issue 45 #3): CLIP image embeddings served through the gateway's `/v1/embeddings` (images as `image_url` data
URLs, as vLLM's multimodal embeddings take them) against the same model in-process, one image at a time and batched.

    .venv/bin/python -m pytest -q -s -p tests.conftest benchmarks/probes/clip_embeddings.py
    (env: CLIP_CLIENTS="1 32", CLIP_IMAGES="1 32", CLIP_SECONDS=10, CLIP_OUT=file.json)

A CLIP of ViT-B/32's shape (random weights, benchmarks/tasks/build_media.py; float32, max_batch_size 64, on the GPU
where there is one: `bash benchmarks/gpu/device.sh clip`). The yardstick is what a user's own loop does in-process:
decode the PNG, CLIPImageProcessor, get_image_features, L2-normalise (the served vectors are normalised the same
way), at batch 1 and at batch 64. Served: CLIENTS closed loops each posting IMAGES PNGs per request (bodies encoded once,
before the clock); every answer's first vector is checked against the in-process one. On 2 cores the load generator
shares the CPU with the server and the gateway: compare ratios measured in the same run."""

from __future__ import annotations

import base64
import json
import os
import statistics
import time
import urllib.request
from pathlib import Path

import pytest

from hf2triton import host
from tests.helpers import make_workflow, run_clients

CLIENTS = [int(n) for n in os.environ.get("CLIP_CLIENTS", "1 32").split()]
IMAGES = [int(n) for n in os.environ.get("CLIP_IMAGES", "1 32").split()]
SECONDS = float(os.environ.get("CLIP_SECONDS", "10"))
DISTINCT = 8  # distinct synthetic images, cycled
TOLERANCE = 1e-3  # max |served - in-process| per vector component (normalised vectors, float32)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from benchmarks.tasks.build_media import build_clip

    model = build_clip(tmp_path_factory.mktemp("clip") / "clip")
    entry = {"name": "clip", "source": str(model), "max_batch_size": 64, "dtype": "float32"}
    entry["dynamic_batching"] = {"max_queue_delay_us": 2000}
    workflow = make_workflow(tmp_path_factory.mktemp("clip-embeddings"), [entry])
    workflow.config["openai"] = {"enabled": True, "port": host.free_ports(1)[0]}
    workflow.run("serve")
    yield workflow, model
    workflow.stop()


def in_process(model: Path, images: list[bytes], device: str):
    """(embed(pngs) -> normalised vectors, as the served model computes them on its own; the model, for its size)."""
    import io

    import torch
    from PIL import Image
    from transformers import CLIPImageProcessor, CLIPModel

    processor = CLIPImageProcessor.from_pretrained(model)
    clip = CLIPModel.from_pretrained(model).to(device).eval()

    def embed(pngs: list[bytes]):
        pixels = processor(images=[Image.open(io.BytesIO(png)).convert("RGB") for png in pngs], return_tensors="pt")["pixel_values"]
        with torch.inference_mode():
            features = clip.get_image_features(pixel_values=pixels.to(device))
            return torch.nn.functional.normalize(features.float(), dim=-1).cpu().numpy()

    return embed


def rate(embed, images: list[bytes], batch: int, seconds: float) -> float:
    """In-process images/s at `batch` images per call, for `seconds` (after one warm-up call)."""
    rows = [images[i % len(images)] for i in range(batch)]
    embed(rows)
    began, done = time.perf_counter(), 0
    while time.perf_counter() - began < seconds:
        embed(rows)
        done += batch
    return done / (time.perf_counter() - began)


def closed_loops(url: str, body: bytes, count: int, expected, clients: int, seconds: float) -> dict:
    """`clients` threads posting `body` (`count` images) for `seconds`: images/s, request latency p50, the largest
    difference of an answer's first vector from the in-process one, failures."""
    import numpy as np

    latencies: list[float] = []
    worst, failed = [0.0], [0]
    stop = time.perf_counter() + seconds

    def loop() -> None:
        while time.perf_counter() < stop:
            began = time.perf_counter()
            request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})  # noqa: S310
            try:
                with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 - the local gateway
                    answer = json.loads(response.read())
            except OSError:
                failed[0] += 1
                continue
            latencies.append(time.perf_counter() - began)
            data = answer["data"]
            if len(data) != count:
                failed[0] += 1
                continue
            worst[0] = max(worst[0], float(np.abs(np.asarray(data[0]["embedding"]) - expected).max()))

    wall = run_clients(loop, clients)
    return {
        "images_per_s": round(len(latencies) * count / wall, 1),
        "latency_p50_s": round(statistics.median(latencies), 4) if latencies else None,
        "requests": len(latencies),
        "failed": failed[0],
        "max_difference": worst[0],
    }


def test_served_embeddings_against_the_model_in_process(served):
    import torch

    from hf2triton.pipeline.image_probes import encoded, synthetic_image

    workflow, model = served
    images = [encoded(synthetic_image(320, 240, seed), "PNG") for seed in range(DISTINCT)]
    device = "cuda" if torch.cuda.is_available() else "cpu"  # where the served model runs (device auto)
    embed = in_process(model, images, device)
    expected = embed(images[:1])[0]
    yardstick = {f"batch {batch}": round(rate(embed, images, batch, SECONDS / 2), 1) for batch in (1, 64)}
    del embed
    if device == "cuda":
        torch.cuda.empty_cache()
    url = f"http://127.0.0.1:{workflow.config['openai']['port']}/v1/embeddings"
    item = lambda png: {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}  # noqa: E731
    cells = []
    for count in IMAGES:
        body = json.dumps({"model": "clip", "input": [item(images[i % DISTINCT]) for i in range(count)]}).encode()
        closed_loops(url, body, count, expected, max(CLIENTS), 2.0)  # warm-up: this request size's first batches
        for clients in CLIENTS:
            cell = {"images_per_request": count, "clients": clients, **closed_loops(url, body, count, expected, clients, SECONDS)}
            cell["vs_batch_1"] = round(cell["images_per_s"] / yardstick["batch 1"], 2)
            cell["vs_batch_64"] = round(cell["images_per_s"] / yardstick["batch 64"], 2)
            print(cell, flush=True)
            cells.append(cell)
    summary = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "model": "CLIP ViT-B/32 shape, random weights, float32",
        "in_process_images_per_s": yardstick,
        "cells": cells,
    }
    print(json.dumps(summary, indent=1))
    if os.environ.get("CLIP_OUT"):
        Path(os.environ["CLIP_OUT"]).write_text(json.dumps(summary, indent=1))
    assert all(cell["failed"] == 0 and cell["requests"] > 0 for cell in cells), cells
    assert max(cell["max_difference"] for cell in cells) <= TOLERANCE, cells
