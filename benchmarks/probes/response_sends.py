"""Issue 46 #1 on this CPU: what one streamed piece costs in the Python backend's stub, and what sends it faster --
no model, only the responses. A decoupled Python model (written here) emulates the engine's output loop: every
`--step-ms` it makes one piece for every open stream and hands them to response threads that send them, as
hf2triton's Responder does; C gRPC streams (tritonclient.grpc.aio) each ask for P pieces. Variants, alternating
rounds:

- `1 thread + ask`: one response thread, and after each send it asks Triton whether the client left
  (`sender.is_cancelled()`, another round trip to the server) -- the Responder before issue 46;
- `1 thread`: the same without the per-send question (the Responder asks every POLL_S instead);
- `threads_N`: the open streams split over N response threads, no per-send question.

Per variant: pieces/s delivered, the time between a stream's pieces (ITL p50 / p99) and pieces per response (held
pieces go out together, as the Responder coalesces them). The client and the server share the machine's cores: say
so next to the figures.

    .venv/bin/python benchmarks/probes/response_sends.py [--clients 32] [--pieces 200] [--step-ms 2] [--threads 2 4 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hf2triton import host  # noqa: E402
from hf2triton.specs import ServerSpec  # noqa: E402
from hf2triton.triton import client  # noqa: E402
from hf2triton.triton.process import start_server, stop_server  # noqa: E402
from hf2triton.triton.settings import Settings  # noqa: E402

MODEL = '''
import json, threading, time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Every STEP_S, one piece per open stream, handed to response threads (a stream always to the same one)."""

    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        self.threads, self.ask, self.step_s = int(params["threads"]), params["ask"] == "1", float(params["step_ms"]) / 1000
        self.lock = threading.Condition()
        self.streams = []  # [sender, pieces left, thread index]
        self.pending = [[] for _ in range(self.threads)]  # per response thread: (stream, pieces made since its last send)
        self.wake = [threading.Condition(self.lock) for _ in range(self.threads)]
        self.count = 0
        threading.Thread(target=self.engine, daemon=True).start()
        for index in range(self.threads):
            threading.Thread(target=self.respond, args=(index,), daemon=True).start()

    def execute(self, requests):
        with self.lock:
            for request in requests:
                pieces = int(pb_utils.get_input_tensor_by_name(request, "pieces").as_numpy().reshape(-1)[0])
                self.streams.append({"sender": request.get_response_sender(), "left": pieces, "made": 0, "queued": False,
                                     "thread": self.count % self.threads, "done": False})
                self.count += 1
            self.lock.notify_all()
        return None

    def engine(self):
        while True:
            started = time.perf_counter()
            with self.lock:
                while not self.streams:
                    self.lock.wait()
                for stream in self.streams:
                    stream["made"] += 1
                    stream["left"] -= 1
                    stream["done"] = stream["left"] <= 0
                    if not stream["queued"]:
                        stream["queued"] = True
                        self.pending[stream["thread"]].append(stream)
                        self.wake[stream["thread"]].notify()
                self.streams = [s for s in self.streams if not s["done"]]
            time.sleep(max(0.0, self.step_s - (time.perf_counter() - started)))

    def respond(self, index):
        while True:
            with self.lock:
                while not self.pending[index]:
                    self.wake[index].wait()
                stream = self.pending[index].pop(0)
                made, done = stream["made"], stream["done"]
                stream["made"], stream["queued"] = 0, False
            sender = stream["sender"]
            text = pb_utils.Tensor("text_output", np.array([b"x" * made], dtype=np.object_))
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if done else 0
            sender.send(pb_utils.InferenceResponse(output_tensors=[text]), flags=final)
            if self.ask and not done:
                sender.is_cancelled()
'''

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input {{ name: "pieces" data_type: TYPE_INT32 dims: [1] }}
output {{ name: "text_output" data_type: TYPE_STRING dims: [1] }}
instance_group {{ count: 1 kind: KIND_CPU }}
parameters {{ key: "threads" value {{ string_value: "{threads}" }} }}
parameters {{ key: "ask" value {{ string_value: "{ask}" }} }}
parameters {{ key: "step_ms" value {{ string_value: "{step_ms}" }} }}
"""


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    threads: int
    ask: bool


def write_repository(root: Path, variants: list[Variant], step_ms: float) -> None:
    for variant in variants:
        version = root / variant.name / "1"
        version.mkdir(parents=True)
        (version / "model.py").write_text(MODEL)
        config = CONFIG.format(name=variant.name, threads=variant.threads, ask=int(variant.ask), step_ms=step_ms)
        (root / variant.name / "config.pbtxt").write_text(config)


async def one_stream(triton, model: str, pieces: int) -> tuple[list[float], int]:
    """The arrival times of a stream's responses and the pieces they carried."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput("pieces", [1], "INT32")
    tensor.set_data_from_numpy(np.array([pieces], dtype=np.int32))

    async def request():
        yield {"model_name": model, "inputs": [tensor]}

    times, carried = [], 0
    async for result, error in triton.stream_infer(request()):
        if error is not None:
            raise RuntimeError(str(error))
        times.append(time.perf_counter())
        carried += len(result.as_numpy("text_output").reshape(-1)[0])
    return times, carried


async def measure(url: str, model: str, clients: int, pieces: int) -> dict:
    import tritonclient.grpc.aio as aio

    triton = client.keyed(aio.InferenceServerClient(url))
    try:
        started = time.perf_counter()
        results = await asyncio.gather(*(one_stream(triton, model, pieces) for _ in range(clients)))
        elapsed = time.perf_counter() - started
    finally:
        await triton.close()
    gaps = sorted(b - a for times, _ in results for a, b in zip(times, times[1:]))
    responses = sum(len(times) for times, _ in results)
    carried = sum(count for _, count in results)
    return {
        "pieces_per_s": round(carried / elapsed, 1),
        "responses_per_s": round(responses / elapsed, 1),
        "pieces_per_response": round(carried / responses, 2),
        "itl_p50_ms": round(1000 * gaps[len(gaps) // 2], 2),
        "itl_p99_ms": round(1000 * gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))], 2),
        "seconds": round(elapsed, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--pieces", type=int, default=200)
    parser.add_argument("--step-ms", type=float, default=2.0, help="the emulated engine's step: one piece per stream")
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 4, 8], help="response thread counts to try")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    variants = [Variant("one_thread_ask", 1, True), Variant("one_thread", 1, False)]
    variants += [Variant(f"threads_{count}", count, False) for count in args.threads]
    client.create_key()
    with tempfile.TemporaryDirectory(prefix="response-sends-") as tmp:
        repository = Path(tmp) / "repository"
        write_repository(repository, variants, args.step_ms)
        http, grpc, metrics = host.free_ports(3)
        server = ServerSpec(http_port=http, grpc_port=grpc, metrics_port=metrics, supervise=False, startup_timeout_s=90)
        settings = Settings.of(server, [v.name for v in variants], str(Path(tmp) / "work"), str(repository))
        try:
            start_server(settings)
            url = f"127.0.0.1:{grpc}"
            for variant in variants:  # warm-up
                asyncio.run(measure(url, variant.name, 2, 10))
            cells: dict[str, list[dict]] = {v.name: [] for v in variants}
            for round_ in range(args.rounds):
                for variant in variants if round_ % 2 == 0 else variants[::-1]:
                    cell = asyncio.run(measure(url, variant.name, args.clients, args.pieces))
                    cells[variant.name].append(cell)
                    print(f"round {round_} {variant.name}: {cell}", flush=True)
        except Exception:
            print((Path(tmp) / "work" / "server" / "tritonserver.log").read_text()[-3000:])
            raise
        finally:
            stop_server(settings)
    medians = {name: {key: round(statistics.median(c[key] for c in runs), 2) for key in runs[0]} for name, runs in cells.items()}
    base = medians["one_thread_ask"]["pieces_per_s"]
    result = {
        "clients": args.clients,
        "pieces_per_stream": args.pieces,
        "step_ms": args.step_ms,
        "ideal_itl_ms": args.step_ms,
        "rounds": args.rounds,
        "cpus": host.cpu_count(),
        "note": "the load generator shares the machine's cores with the server",
        "median": medians,
        "pieces_per_s_vs_one_thread_ask": {name: round(m["pieces_per_s"] / base, 2) for name, m in medians.items()},
    }
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
