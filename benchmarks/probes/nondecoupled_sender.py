"""Probe (issue 45): can a non-decoupled Python-backend model answer through its requests' response senders after
execute() returned, so that its instance takes the next Triton batch while earlier requests are still being worked on?
(python_backend's README since 24.06: a default-mode model may send its one response with the sender.) Whisper's
running batch (serving/batching/whisper.py) relies on it.

    .venv/bin/python benchmarks/probes/nondecoupled_sender.py

A toy model (max_batch_size 8, dynamic batching, one instance) whose execute() only queues each request's sender and
returns None; a thread answers each request 1 s after it arrived. 16 HTTP and 16 gRPC clients at once, then 16 HTTP
clients 0.1 s apart: with execute() holding the instance until its batch is answered the staggered ones would take
about 16 s; here they take about 2.5 s, and every answer is right (twice the input)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hf2triton import host  # noqa: E402
from hf2triton.triton import client  # noqa: E402
from hf2triton.triton.install import locate_tritonserver, prepare_backend_dir, server_environment  # noqa: E402

CONFIG = """name: "toy"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
MODEL = """import queue, threading, time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.pending = queue.Queue()
        threading.Thread(target=self.answer, daemon=True).start()

    def answer(self):
        while True:
            sender, x, arrived = self.pending.get()
            time.sleep(max(0.0, 1.0 - (time.time() - arrived)))
            out = pb_utils.Tensor("Y", x * 2)
            sender.send(pb_utils.InferenceResponse([out]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy().copy()
            self.pending.put((request.get_response_sender(), x, time.time()))
        return None
"""


def _ready(client, name: str) -> bool:
    try:
        return bool(client.is_model_ready(name))
    except Exception:  # noqa: BLE001 - not listening yet
        return False


@contextlib.contextmanager
def toy_server(name: str, config: str, model: str) -> Iterator[tuple[int, int]]:
    """The wheel's tritonserver on 127.0.0.1 serving one toy Python model (its config.pbtxt and model.py), ready:
    its (HTTP, gRPC) ports; stopped after."""
    work = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    (work / "repo" / name / "1").mkdir(parents=True)
    (work / "repo" / name / "config.pbtxt").write_text(config)
    (work / "repo" / name / "1" / "model.py").write_text(model)
    install = locate_tritonserver()
    http, grpc, metrics = host.free_ports(3)
    command = [install.binary, f"--model-repository={work / 'repo'}", f"--backend-directory={prepare_backend_dir(install, work)}",
               "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", f"--http-port={http}", f"--grpc-port={grpc}",
               f"--metrics-port={metrics}", "--allow-metrics=false", "--exit-timeout-secs=2"]  # fmt: skip
    with open(work / "server.log", "wb") as log:
        server = subprocess.Popen(command, env=server_environment(install), stdout=log, stderr=subprocess.STDOUT)
    # the project's clients send the key (a toy server checks none): one of the toy's own, so no `make serve` is needed
    os.environ[client.KEY_FILE_ENV] = str(work / "triton.key")
    client.create_key()
    try:
        ready = client.http_client(f"127.0.0.1:{http}")
        for _ in range(120):
            if _ready(ready, name):
                break
            time.sleep(0.5)
        yield http, grpc
    finally:
        server.terminate()
        server.wait(30)


def main() -> int:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    with toy_server("toy", CONFIG, MODEL) as (http, grpc):

        def ask(module, url: str, value: int, delay: float = 0.0) -> float:
            time.sleep(delay)
            triton = (client.http_client if module is httpclient else client.grpc_client)(url)  # the project's clients
            tensor = module.InferInput("X", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.array([[value]], dtype=np.float32))
            return float(triton.infer("toy", [tensor]).as_numpy("Y")[0, 0])

        figures = {}
        for label, module, url, gap in (("http at once", httpclient, f"127.0.0.1:{http}", 0.0),
                                        ("grpc at once", grpcclient, f"127.0.0.1:{grpc}", 0.0),
                                        ("http 0.1 s apart", httpclient, f"127.0.0.1:{http}", 0.1)):  # fmt: skip
            started = time.perf_counter()
            with ThreadPoolExecutor(16) as pool:
                answers = list(pool.map(ask, [module] * 16, [url] * 16, range(16), [gap * i for i in range(16)]))
            figures[label] = round(time.perf_counter() - started, 2)
            assert answers == [2.0 * i for i in range(16)], answers
            print(f"{label}: 16 requests of 1 s each answered in {figures[label]} s, every answer right", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
