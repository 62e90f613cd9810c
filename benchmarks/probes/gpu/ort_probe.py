"""Where a small batch's time goes with ONNX Runtime's CUDA provider, side by side with torch, in-process on the GPU
(issue 29: served single texts were slower on ONNX Runtime than on torch). One run measures, per batch size:

- the engines model.py runs: torch float16 eager, torch float16 with CUDA graphs, ONNX Runtime (the float16 export,
  I/O bound: hf2triton.serving.runtimes.onnxruntime.OrtEncoder) eager and with its CUDA graphs per bucket (OrtGraphs: ONNX
  Runtime's graph of the network + a torch graph of the pooling, the served default since issue 29);
- the bare float16 session on one fixed batch: numpy feeds (ONNX Runtime copies), I/O binding as OrtEncoder does,
  I/O binding on torch's own stream (no host sync before the run), and ONNX Runtime's CUDA graph (enable_cuda_graph:
  fixed buffers, one shape).

    python benchmarks/probes/gpu/ort_probe.py MODEL_DIR OUT.json [--seconds 2]     (exports MODEL_DIR in float16 first)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from hf2triton.perf.corpus import bench_texts  # noqa: E402
from hf2triton.pipeline.export import export_onnx_step  # noqa: E402
from hf2triton.serving.runtimes.onnxruntime import ort_session_options  # noqa: E402
from hf2triton.serving.tasks.embedding import EmbeddingEngine  # noqa: E402


def timed(call, seconds: float) -> float:
    """ms per call (after 5 warm-up calls)."""
    for _ in range(5):
        call()
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        call()
        calls += 1
    return round(1000 * (time.perf_counter() - started) / calls, 3)


def stage_split(engine: EmbeddingEngine, texts: list[str], seconds: float) -> dict[str, float]:
    """ms per call of each stage of one engine call, each timed on its own (synchronised): what the engine adds
    around the network."""
    torch = engine.torch

    def synced(call):
        def run():
            with torch.inference_mode():
                call()
            torch.cuda.synchronize()

        return run

    batch = engine.encode(texts)
    return {
        "encode (tokenise, pad, to the GPU)": timed(synced(lambda: engine.encode(texts)), seconds),
        "network": timed(synced(lambda: engine.model(**batch)), seconds),
        "network + pooling": timed(synced(lambda: engine.compute(batch)), seconds),
        "network + pooling + to host": timed(synced(lambda: engine.forward(batch)), seconds),
        "whole run": timed(synced(lambda: engine.run(texts)), seconds),
    }


def bare_session_variants(onnx_path: str, batch: dict, seconds: float) -> dict[str, float]:
    import onnxruntime as ort
    import torch

    ort.preload_dlls()
    stream = torch.cuda.current_stream().cuda_stream
    feeds_np = {k: v.cpu().numpy() for k, v in batch.items()}
    results = {}
    for label, options in (
        ("ort session, numpy feeds", {}),
        ("ort session, I/O bound (host sync first)", {}),
        ("ort session, I/O bound on torch's stream", {"user_compute_stream": str(stream)}),
        ("ort session, CUDA graph (fixed buffers)", {"enable_cuda_graph": "1"}),
    ):
        try:
            results[label] = one_variant(ort, torch, onnx_path, options, label, batch, feeds_np, seconds)
        except Exception as err:  # noqa: BLE001 - a variant ONNX Runtime refuses is a result too
            results[label] = f"failed: {str(err).splitlines()[0][:300]}"
    return results


def one_variant(ort, torch, onnx_path: str, options: dict, label: str, batch: dict, feeds_np: dict, seconds: float) -> float:
    providers = [("CUDAExecutionProvider", {"device_id": 0, **options}), "CPUExecutionProvider"]
    session = ort.InferenceSession(onnx_path, ort_session_options(2), providers=providers)
    names = [i.name for i in session.get_inputs()]
    if label.endswith("numpy feeds"):
        return timed(lambda: session.run(["last_hidden_state"], {k: feeds_np[k] for k in names}), seconds)
    rows, length = batch["input_ids"].shape
    output = torch.empty((rows, length, 384), dtype=torch.float32, device="cuda:0")
    binding = session.io_binding()
    for name in names:
        tensor = batch[name]
        binding.bind_input(name, "cuda", 0, np.int64, tuple(tensor.shape), tensor.data_ptr())
    binding.bind_output("last_hidden_state", "cuda", 0, np.float32, tuple(output.shape), output.data_ptr())
    sync_first = "host sync" in label

    def run():
        if sync_first:
            torch.cuda.current_stream().synchronize()
        session.run_with_iobinding(binding)

    return timed(run, seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("out")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    texts = bench_texts(512, max_words=90)
    onnx_dir = Path(tempfile.mkdtemp(prefix="ort-probe-")) / "onnx"
    export_onnx_step(args.model_dir, "feature-extraction", 17, "auto", "O2", "none", str(onnx_dir), "float16")
    engines = {
        "torch float16 eager": EmbeddingEngine(args.model_dir, device="cuda:0", cuda_graphs=False),
        "torch float16 CUDA graphs": EmbeddingEngine(args.model_dir, device="cuda:0", cuda_graphs=True),
        "onnxruntime float16 (OrtEncoder)": EmbeddingEngine(
            args.model_dir, device="cuda:0", backend="onnx", onnx_dir=str(onnx_dir), num_threads=2, cuda_graphs=False
        ),
        "onnxruntime float16, CUDA graphs (OrtGraphs)": EmbeddingEngine(
            args.model_dir, device="cuda:0", backend="onnx", onnx_dir=str(onnx_dir), num_threads=2, cuda_graphs=True
        ),
    }
    report: dict = {"engines_ms_per_call": {}, "stages_ms_per_call": {}, "bare_session_ms_per_call": {}}
    for batch in (1, 4, 16, 64, 256):
        chunk = texts[:batch]
        report["engines_ms_per_call"][batch] = {label: timed(lambda e=e, c=chunk: e.run(c), args.seconds) for label, e in engines.items()}
        print(batch, report["engines_ms_per_call"][batch], flush=True)
    for batch in (1, 16):
        report["stages_ms_per_call"][batch] = {
            label: stage_split(engines[label], texts[:batch], args.seconds / 2)
            for label in ("torch float16 eager", "onnxruntime float16 (OrtEncoder)")
        }
        print(batch, report["stages_ms_per_call"][batch], flush=True)
    ort_engine = engines["onnxruntime float16 (OrtEncoder)"]
    for batch in (1, 16):
        padded = ort_engine.encode(texts[:batch])
        padded = {k: v.to("cuda:0").contiguous() for k, v in padded.items()}
        report["bare_session_ms_per_call"][batch] = {"shape": list(padded["input_ids"].shape)} | bare_session_variants(
            str(onnx_dir / "model.onnx"), padded, args.seconds
        )
        print(batch, report["bare_session_ms_per_call"][batch], flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
