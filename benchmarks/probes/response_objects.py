"""Probe (issue 46): what building one streamed response costs inside a real Python-backend stub, where the response
threads hold the GIL for it (on an H100 at 32 clients they held 44-47 % of the stub's GIL time, half of it in
model.py's `_bytes`: benchmarks/h200/README.md, 2026-12-06).

    .venv/bin/python benchmarks/probes/response_objects.py [--count 20000] [--out FILE.json]

A toy model times, in its stub, COUNT repetitions of each way to build one text piece's response (nothing is sent),
alternating 5 rounds, and answers with the medians in µs: the numpy object array alone, python_backend's
`pb_utils.Tensor` over it (what serving/model.py's `_bytes` does; its constructor compares the array's dtype with 12
numpy types before `object_` and serializes the bytes with `serialize_byte_tensor`, a Python loop over `np.nditer`),
the same with a one-item fast path in place of `serialize_byte_tensor`, a fixed-width `np.bytes_` array instead, and
the whole `InferenceResponse`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from nondecoupled_sender import toy_server  # noqa: E402

from hf2triton.triton import client  # noqa: E402

CONFIG = """name: "objects"
backend: "python"
max_batch_size: 0
input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TIMINGS" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
MODEL = """import json, statistics, struct, time
import numpy as np
import triton_python_backend_utils as pb_utils

PIECE = " token".encode()
ORIGINAL = pb_utils.serialize_byte_tensor


def one_item(tensor):
    if tensor.dtype == np.object_ and tensor.size == 1:
        item = tensor.item()
        if type(item) is bytes:
            return struct.pack("<I", len(item)) + item
    return ORIGINAL(tensor)


def fast_tensor():
    pb_utils.serialize_byte_tensor = one_item
    try:
        return pb_utils.Tensor("TEXT_OUTPUT", np.array([PIECE], dtype=np.object_))
    finally:
        pb_utils.serialize_byte_tensor = ORIGINAL


WAYS = {
    "numpy_object_array": lambda: np.array([PIECE], dtype=np.object_),
    "tensor_object_array (model.py _bytes)": lambda: pb_utils.Tensor("TEXT_OUTPUT", np.array([PIECE], dtype=np.object_)),
    "tensor_object_array_one_item_serializer": fast_tensor,
    "tensor_bytes_array": lambda: pb_utils.Tensor("TEXT_OUTPUT", np.array([PIECE], dtype=np.bytes_)),
    "response (tensor + InferenceResponse)": lambda: pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor("TEXT_OUTPUT", np.array([PIECE], dtype=np.object_))]),
}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            rounds = {name: [] for name in WAYS}
            for _ in range(5):
                for name, way in WAYS.items():
                    started = time.perf_counter()
                    for _ in range(count):
                        way()
                    rounds[name].append(1e6 * (time.perf_counter() - started) / count)
            same = bytes(ORIGINAL(np.array([PIECE], dtype=np.object_))) == one_item(np.array([PIECE], dtype=np.object_))
            result = {"us_median": {n: round(statistics.median(v), 3) for n, v in rounds.items()},
                      "us_rounds": {n: [round(x, 3) for x in v] for n, v in rounds.items()}, "one_item_same_bytes": same}
            out = pb_utils.Tensor("TIMINGS", np.array([json.dumps(result).encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""


def main() -> int:
    import tritonclient.http as httpclient

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with toy_server("objects", CONFIG, MODEL) as (http, _):
        count = httpclient.InferInput("COUNT", [1], "INT32")
        count.set_data_from_numpy(np.array([args.count], dtype=np.int32))
        answer = client.http_client(f"127.0.0.1:{http}", network_timeout=600).infer("objects", [count])
        result = json.loads(answer.as_numpy("TIMINGS")[0])
    result.update(command="python " + " ".join(sys.argv), measured_at=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()))
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
