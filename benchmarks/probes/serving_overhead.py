"""What serving adds to one request, apart from the model (issue 13: served >= 0.9x in-process at 256 texts).

A tiny random-weight BERT (2 layers, hidden 32) with MiniLM's real tokenizer makes the model's compute
negligible, so what remains of a request's latency is the serving path: the client building the request, the
frontend, the Python-backend stub's IPC, decoding the texts, tokenising, building the responses. It is served by
the real workflow (scratch directory, free ports) and measured one request at a time (no queueing):

    .venv/bin/python benchmarks/probes/serving_overhead.py [--texts 1 32 256] [--seconds 5] [--out FILE]

Per request size: the in-process engine call (engine.run, as bench's yardstick), the served latency over
gRPC and HTTP (p50), Triton's own split of it (queue, compute input / infer / output per request), and the
tritonclient request construction alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hf2triton import host  # noqa: E402
from hf2triton.perf.corpus import bench_texts  # noqa: E402
from hf2triton.triton import client as triton_client  # noqa: E402
from hf2triton.triton.process import stop_server  # noqa: E402
from tests.helpers import serve_scratch  # noqa: E402


def tiny_embedder(directory: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from tests.helpers import minilm_dir

    if (directory / "config.json").is_file():
        return directory
    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=512)
    BertModel(config).save_pretrained(directory)
    AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(directory)
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}))
    return directory


def inference_stats(grpc) -> dict[str, tuple[int, int]]:
    """Cumulative (ns, count) per stage of the served model, from Triton's statistics."""
    stats = grpc.get_inference_statistics("tiny", as_json=True)["model_stats"][0]["inference_stats"]
    stages = ("queue", "compute_input", "compute_infer", "compute_output")
    return {k: (int(stats[k].get("ns", 0)), int(stats[k].get("count", 0))) for k in stages}


def median_ms(call, seconds: float, least: int = 20) -> float:
    call()
    times, started = [], time.perf_counter()
    while time.perf_counter() - started < seconds or len(times) < least:
        begin = time.perf_counter()
        call()
        times.append(time.perf_counter() - begin)
    return round(statistics.median(times) * 1e3, 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--delay-us", type=int, default=2000, help="dynamic_batching.max_queue_delay_us (a lone request waits it out)")
    parser.add_argument("--work", default=str(ROOT / "benchmarks" / ".work" / "overhead"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "bench-2cpu" / "serving-overhead.json"))
    args = parser.parse_args()
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from hf2triton.serving.tasks.embedding import EmbeddingEngine

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = tiny_embedder(work / "tiny-embed")
    biggest = max(args.texts)
    entry = {"name": "tiny", "source": str(model), "task": "feature-extraction"}
    entry.update(max_batch_size=biggest, max_texts_per_request=biggest, dynamic_batching={"max_queue_delay_us": args.delay_us})
    settings = serve_scratch(work, [entry])
    corpus = [t.encode() for t in bench_texts(max(args.texts), max_words=90)]
    engine = EmbeddingEngine(str(work / ".hf2triton" / "models" / "tiny" / "pretrained"), num_threads=host.cpu_count())
    grpc = triton_client.grpc_client(settings.url("grpc_port"))
    http = triton_client.http_client(settings.url("http_port"))
    results: dict = {"cpus": host.cpu_count(), "model": "tiny BERT (2 layers, hidden 32), MiniLM tokenizer", "delay_us": args.delay_us}
    results["rows"] = []
    try:
        for count in args.texts:
            texts = corpus[:count]
            strings = [t.decode() for t in texts]
            row = {"texts": count, "engine_ms": median_ms(lambda s=strings: engine.run(s), args.seconds)}
            row["build_request_ms"] = median_ms(lambda t=texts: triton_client.build_inputs(grpcclient, t), args.seconds / 2)
            before = inference_stats(grpc)
            for name, client, module in (("grpc", grpc, grpcclient), ("http", http, httpclient)):
                infer = lambda c=client, m=module, t=texts: c.infer("tiny", triton_client.build_inputs(m, t))  # noqa: E731
                row[f"{name}_ms"] = median_ms(infer, args.seconds)
            after = inference_stats(grpc)
            row["triton_per_request_ms"] = {  # Triton's own split, means over this size's requests (both protocols)
                k: round((after[k][0] - before[k][0]) / max(1, after[k][1] - before[k][1]) / 1e6, 3) for k in after
            }
            row["grpc_minus_engine_ms"] = round(row["grpc_ms"] - row["engine_ms"], 3)
            row["served_vs_engine_grpc"] = round(row["engine_ms"] / row["grpc_ms"], 3)
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
    finally:
        stop_server(settings)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
