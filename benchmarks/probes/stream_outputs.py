"""Probe (issue 46 #2): what reading one streamed piece's outputs costs the gateway's worker, per piece.

    .venv/bin/python benchmarks/probes/stream_outputs.py --out benchmarks/generation-2cpu/stream-outputs.json

The gateway reads every piece of a Triton gRPC stream on its event loop: a middle piece has one output (text_output),
the last one four (text, finish reason, prompt and completion token counts). Two ways over the same responses, in
alternating rounds: tritonclient's `InferResult.as_numpy` per name (what the gateway did: a walk over the outputs, a
numpy array and a reshape per name, three names asked per piece) and `client.first_values` (one pass over the raw
contents). Both must read the same values."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.grpc._infer_result import InferResult

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hf2triton.serving import interface  # noqa: E402
from hf2triton.triton.client import first_values  # noqa: E402


def response(text: str, final: bool) -> InferResult:
    message = service_pb2.ModelInferResponse(model_name="smollm2", model_version="1")
    encoded = text.encode()
    outputs = [(interface.TEXT_OUTPUT, "BYTES", len(encoded).to_bytes(4, "little") + encoded)]
    if final:
        outputs += [
            (interface.FINISH_REASON, "BYTES", (6).to_bytes(4, "little") + b"length"),
            (interface.PROMPT_TOKENS, "INT32", np.array([37], dtype=np.int32).tobytes()),
            (interface.COMPLETION_TOKENS, "INT32", np.array([128], dtype=np.int32).tobytes()),
        ]
    for name, datatype, content in outputs:
        message.outputs.add(name=name, datatype=datatype, shape=[1])
        message.raw_output_contents.append(content)
    return InferResult(message)


def through_as_numpy(result: InferResult) -> tuple:
    """The gateway's reading before first_values (hf2triton/gateway/api/generation.py, 2026-12-06)."""
    piece = result.as_numpy(interface.TEXT_OUTPUT)
    text = piece.reshape(-1)[0].decode("utf-8") if piece is not None else ""
    result.as_numpy(interface.TOKEN_LOGPROBS)
    reason = result.as_numpy(interface.FINISH_REASON)
    if reason is None:
        return text, None
    prompt = int(result.as_numpy(interface.PROMPT_TOKENS).reshape(-1)[0])
    return text, (reason.reshape(-1)[0].decode(), prompt, int(result.as_numpy(interface.COMPLETION_TOKENS).reshape(-1)[0]))


def through_first_values(result: InferResult) -> tuple:
    values = first_values(result)
    text = values.get(interface.TEXT_OUTPUT, b"").decode("utf-8")
    reason = values.get(interface.FINISH_REASON)
    if reason is None:
        return text, None
    return text, (reason.decode(), values[interface.PROMPT_TOKENS], values[interface.COMPLETION_TOKENS])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pieces", type=int, default=128, help="pieces per answer, the last one final")
    parser.add_argument("--answers", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    answer = [response(f" word{index}", index == args.pieces - 1) for index in range(args.pieces)]
    ways = {"as_numpy": through_as_numpy, "first_values": through_first_values}
    assert [through_as_numpy(r) for r in answer] == [through_first_values(r) for r in answer], "the two ways differ"
    timings: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, read in ways.items():
            started = time.perf_counter()
            for _ in range(args.answers):
                for result in answer:
                    read(result)
            timings[name].append((time.perf_counter() - started) / (args.answers * args.pieces) * 1e6)
    medians = {name: round(statistics.median(values), 2) for name, values in timings.items()}
    out = {
        "us_per_piece_median": medians,
        "us_per_piece_rounds": {name: [round(v, 2) for v in values] for name, values in timings.items()},
        "ratio_as_numpy_over_first_values": round(medians["as_numpy"] / medians["first_values"], 2),
        "pieces_per_answer": args.pieces,
        "same_values": True,
    }
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
