"""What writing one /v1/embeddings answer costs the gateway, side by side in one run (alternating rounds):
the answer as a returned dict (FastAPI's jsonable_encoder, then json.dumps; how the gateway answered before)
against `ArrayJSONResponse` (orjson over the numpy rows; the standard library where orjson is missing).

    .venv/bin/python benchmarks/probes/gateway_json.py [--texts 1 32 256] [--dim 384] [--rounds 3] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fastapi.encoders import jsonable_encoder  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402

from hf2triton.gateway import responses as gateway_app  # noqa: E402


def answer(vectors: np.ndarray, encoding: str, as_lists: bool) -> dict:
    rows = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(v.tobytes()).decode() if encoding == "base64" else ([float(x) for x in v] if as_lists else v),
        }
        for i, v in enumerate(vectors)
    ]
    return {"object": "list", "data": rows, "model": "minilm", "usage": {"prompt_tokens": 1, "total_tokens": 1}}


def returned_dict(vectors: np.ndarray, encoding: str) -> bytes:
    return JSONResponse(jsonable_encoder(answer(vectors, encoding, as_lists=True))).body


def array_response(vectors: np.ndarray, encoding: str) -> bytes:
    return gateway_app.ArrayJSONResponse(answer(vectors, encoding, as_lists=False)).body


def ms_per_call(write, vectors: np.ndarray, encoding: str, seconds: float = 1.0) -> float:
    write(vectors, encoding)
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        write(vectors, encoding)
        calls += 1
    return (time.perf_counter() - started) / calls * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    writer = "orjson " + gateway_app.orjson.__version__ if gateway_app.orjson is not None else "json (orjson not installed)"
    print(f"ArrayJSONResponse writes with {writer}")
    print("| encoding | texts | round | returned dict ms | ArrayJSONResponse ms | ratio |\n|---|---|---|---|---|---|")
    cells = []
    rng = np.random.default_rng(0)
    for encoding in ("float", "base64"):
        for texts in args.texts:
            vectors = rng.standard_normal((texts, args.dim)).astype(np.float32)
            assert (
                json.loads(returned_dict(vectors, encoding))["data"] == json.loads(array_response(vectors, encoding))["data"]
                or encoding == "float"
            )
            for round_ in range(1, args.rounds + 1):
                old = ms_per_call(returned_dict, vectors, encoding)
                new = ms_per_call(array_response, vectors, encoding)
                cells.append(
                    {
                        "encoding": encoding,
                        "texts": texts,
                        "round": round_,
                        "returned_dict_ms": round(old, 3),
                        "array_response_ms": round(new, 3),
                    }
                )
                print(f"| {encoding} | {texts} | {round_} | {old:.2f} | {new:.2f} | {old / new:.1f}x |", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"writer": writer, "dim": args.dim, "cells": cells}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
