"""Probe (issue 45): Whisper served with continuous batching (the decoding steps of all requests in one running batch,
`continuous_batching: true`, the default) against each Triton batch as one generate() (`false`), side by side in one
server, against transformers' pipeline in-process one audio at a time (the issue's yardstick).

    .venv/bin/python -m pytest -q -s -p tests.conftest benchmarks/probes/speech_batching.py
    (env: SPEECH_SHAPE=tiny|small, SPEECH_CLIENTS=16, SPEECH_SECONDS=20, SPEECH_ROUNDS=2, SPEECH_OUT=file.json)

A Whisper of tiny's shape (random weights, benchmarks/tasks/build_media.py; answers run to its max_length of 32
tokens, beam search of 5 as the pipeline's default; float32) is served twice (`steps` and `whole`, max_batch_size 32;
on the GPU where there is one, as the pipeline then runs: `bash benchmarks/gpu/device.sh speech`). CLIENTS
closed loops each send one 5 s WAV at a time over Triton's HTTP infer; the two models take turns, ROUNDS rounds of
SECONDS each; every answer is checked against the pipeline's. On 2 cores the load generator shares the CPU with the
server: compare the ratio between the two models, measured in the same run."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import pytest

from tests.helpers import make_workflow, run_clients

SHAPE = os.environ.get("SPEECH_SHAPE", "tiny")
CLIENTS = int(os.environ.get("SPEECH_CLIENTS", "16"))
SECONDS = float(os.environ.get("SPEECH_SECONDS", "20"))
ROUNDS = int(os.environ.get("SPEECH_ROUNDS", "2"))
AUDIO_S = 5.0
MODELS = {"steps": True, "whole": False}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from benchmarks.tasks.build_media import build_whisper

    model = build_whisper(tmp_path_factory.mktemp("whisper") / f"whisper-{SHAPE}", SHAPE)
    # float32: random weights leave near-ties that float16's rounding may break otherwise (media-overlay.yaml)
    entry = {"source": str(model), "max_batch_size": 32, "dtype": "float32"}
    entries = [{"name": name, **entry, "continuous_batching": steps} for name, steps in MODELS.items()]
    workflow = make_workflow(tmp_path_factory.mktemp("speech-batching"), entries)
    workflow.run("serve")
    yield workflow, model
    workflow.stop()


def closed_loops(url: str, model: str, audio: bytes, expected: bytes, clients: int, seconds: float) -> dict:
    """`clients` threads sending one audio each at a time for `seconds`: answers/s and latency p50 (wrong answers counted)."""
    import tritonclient.http as httpclient

    from hf2triton.serving import interface
    from hf2triton.triton import client as triton_client

    latencies: list[float] = []
    wrong = [0]
    stop = time.perf_counter() + seconds

    def loop() -> None:
        triton = triton_client.http_client(url)
        inputs = triton_client.build_inputs(httpclient, [audio], None, primary=interface.AUDIO)
        while time.perf_counter() < stop:
            began = time.perf_counter()
            text = triton.infer(model, inputs).as_numpy(interface.TEXT_OUTPUT).reshape(-1)[0]
            latencies.append(time.perf_counter() - began)
            wrong[0] += text != expected
        triton.close()

    wall = run_clients(loop, clients)
    return {
        "audios_per_s": round(len(latencies) / wall, 2),
        "latency_p50_s": round(statistics.median(latencies), 3),
        "answers": len(latencies),
        "wrong": wrong[0],
    }


def test_continuous_batching_against_whole_batches(served):
    import torch
    import transformers

    from hf2triton.pipeline.audio_probes import encoded_audio, synthetic_audio
    from hf2triton.serving.audio import decode_audio

    workflow, model = served
    audio = encoded_audio(synthetic_audio(AUDIO_S, 16000), 16000, "WAV")
    samples = decode_audio(audio, 16000, 600)  # what the server decodes the WAV to
    device = "cuda" if torch.cuda.is_available() else "cpu"  # where the served models run (device auto)
    pipe = transformers.pipeline("automatic-speech-recognition", model=str(model), device=device, torch_dtype=torch.float32)
    expected = pipe({"raw": samples, "sampling_rate": 16000})["text"].encode("utf-8")  # the answer every request must get
    began, done = time.perf_counter(), 0
    while time.perf_counter() - began < SECONDS / 2:
        pipe({"raw": samples, "sampling_rate": 16000})
        done += 1
    pipeline_rate = done / (time.perf_counter() - began)
    del pipe
    url = workflow.settings().url("http_port")
    for name in MODELS:  # warm-up: first requests, the running batch's first shapes
        closed_loops(url, name, audio, expected, CLIENTS, 2.0)
    cells: list[dict] = []
    for round_ in range(ROUNDS):
        for name in MODELS if round_ % 2 == 0 else reversed(list(MODELS)):
            cell = {"model": name, "round": round_ + 1, **closed_loops(url, name, audio, expected, CLIENTS, SECONDS)}
            print(cell, flush=True)
            cells.append(cell)
    rate = {name: statistics.median(c["audios_per_s"] for c in cells if c["model"] == name) for name in MODELS}
    summary = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "shape": SHAPE,
        "clients": CLIENTS,
        "audio_seconds": AUDIO_S,
        "pipeline_batch1_audios_per_s": round(pipeline_rate, 2),
        "audios_per_s": rate,
        "steps_over_whole": round(rate["steps"] / rate["whole"], 3),
        "steps_over_pipeline": round(rate["steps"] / pipeline_rate, 2),
        "whole_over_pipeline": round(rate["whole"] / pipeline_rate, 2),
        "cells": cells,
        "note": f"{os.cpu_count()} cores: the load generator shares them with the server",
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "cells"}, indent=1))
    if os.environ.get("SPEECH_OUT"):
        Path(os.environ["SPEECH_OUT"]).write_text(json.dumps(summary, indent=1) + "\n")
    assert not any(c["wrong"] for c in cells), cells
