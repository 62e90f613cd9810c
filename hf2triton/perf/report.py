"""The human side of `bench` and `tune`: PNG plots and a Markdown report from the measured JSON files,
and the ratios printed at the end of a run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hf2triton.fsutil import atomic_write_json, atomic_write_text

GOALS = {
    "served_vs_raw": 0.95,
    "singles_vs_raw": 0.9,
    "stream_vs_static": 1.5,
    "stream_c1_vs_inprocess": 0.95,
    "openai_tokens_per_s": 0.95,
    "openai_ttft_added_ms": 10.0,
    "openai_texts_per_s": 0.9,
    "vs_pipeline_batch1": 3.0,
    "vs_pipeline_best_batched": 0.9,
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot_throughput(result: dict[str, Any], path: Path) -> None:
    """Items/s against concurrency, one line per protocol x request size, raw in-process as dashed lines."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    levels = result["bench"]["concurrency"]
    for protocol in result["bench"]["protocols"]:
        for size in sorted({c["request_texts"] for c in result["served"]}):
            cells = sorted(
                (c for c in result["served"] if c["protocol"] == protocol and c["request_texts"] == size), key=lambda c: c["concurrency"]
            )
            ax.plot(
                [c["concurrency"] for c in cells],
                [c["items_per_s"] for c in cells],
                marker="o",
                label=f"{protocol}, {size} text(s)/request",
            )
    for batch, figures in result["raw"][result["backend"]].items():
        ax.axhline(figures["items_per_s"], linestyle="--", linewidth=1, color="grey")
        ax.annotate(f"in-process batch {batch}", (levels[0], figures["items_per_s"]), fontsize=8, color="grey", va="bottom")
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel(f"{result['items']}/s")
    ax.set_title(f"{result['model']} ({result['backend']}): throughput")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_latency(result: dict[str, Any], path: Path) -> None:
    """p50/p90/p99 per cell, and Triton's server-side phases under it."""
    plt = _pyplot()
    cells = result["served"]
    labels = [f"{c['protocol']}\n{c['request_texts']}x c{c['concurrency']}" for c in cells]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(7, 0.6 * len(cells)), 6.5), sharex=True)
    xs = range(len(cells))
    for key, marker in (("p50", "o"), ("p90", "s"), ("p99", "^")):
        top.plot(xs, [c["latency_ms"][key] for c in cells], marker=marker, linestyle="", label=key)
    top.set_yscale("log")
    top.set_ylabel("client latency (ms)")
    top.set_title(f"{result['model']}: latency percentiles and server-side breakdown")
    top.grid(alpha=0.3)
    top.legend(fontsize=8)
    bottom_base = [0.0] * len(cells)
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        values = [c["server"].get(f"{phase}_us", 0) / 1000 for c in cells]
        bottom.bar(xs, values, bottom=bottom_base, label=phase)
        bottom_base = [a + b for a, b in zip(bottom_base, values)]
    bottom.set_ylabel("server ms / request")
    bottom.legend(fontsize=8)
    bottom.set_xticks(list(xs), labels, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_generation(result: dict[str, Any], paths: dict[str, Path]) -> None:
    """Streaming model: tokens/s (streamed vs static, in-process dashed) and TTFT / inter-token latency."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for mode in ("stream", "static"):
        cells = sorted(result[mode], key=lambda c: c["concurrency"])
        if cells:
            ax.plot([c["concurrency"] for c in cells], [c["items_per_s"] for c in cells], marker="o", label=f"{mode}")
    ax.axhline(result["inprocess"]["items_per_s"], linestyle="--", linewidth=1, color="grey", label="in-process generate(), one by one")
    levels = result["bench"]["concurrency"]
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("generated tokens/s")
    ax.set_title(f"{result['model']}: streaming (continuous batching) vs static")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths["throughput"], dpi=100)
    plt.close(fig)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True)
    for mode, color in (("stream", "tab:blue"), ("static", "tab:orange")):
        cells = sorted(result[mode], key=lambda c: c["concurrency"])
        xs = [c["concurrency"] for c in cells]
        for key, style in (("p50", "-o"), ("p99", "--^")):
            top.plot(xs, [c["ttft_ms"][key] for c in cells], style, color=color, label=f"{mode} TTFT {key}")
            if mode == "stream":
                bottom.plot(xs, [c["itl_ms"][key] for c in cells], style, color=color, label=f"inter-token {key}")
    top.set_yscale("log")
    top.set_ylabel("time to first token (ms)")
    top.set_title(f"{result['model']}: time to first token and between tokens")
    bottom.set_ylabel("inter-token latency (ms)")
    bottom.set_xscale("log", base=2)
    bottom.set_xticks(levels, [str(c) for c in levels])
    bottom.set_xlabel("concurrent requests")
    for axis in (top, bottom):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths["latency"], dpi=100)
    plt.close(fig)


def plot_tune_grid(name: str, entry: dict[str, Any], budget_ms: float, path: Path) -> None:
    """Throughput of every variant (bars), green inside the p99 budget, with p99 written on each bar."""
    plt = _pyplot()
    rows = sorted(entry["rows"], key=lambda r: r["cell"]["items_per_s"])
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.32 * len(rows) + 1)))
    values = [r["cell"]["items_per_s"] for r in rows]
    colors = ["tab:green" if r["cell"]["latency_ms"]["p99"] <= budget_ms and not r["cell"]["errors"] else "tab:red" for r in rows]
    ax.barh(range(len(rows)), values, color=colors)
    labels = [
        r["id"] + (" (current)" if r["id"] == entry["baseline"] else "") + (" <- chosen" if r["id"] == entry["best"] else "") for r in rows
    ]
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    for i, r in enumerate(rows):
        ax.annotate(f" p99 {r['cell']['latency_ms']['p99']:,.0f} ms", (values[i], i), va="center", fontsize=7)
    ax.set_xlabel("items/s (green: p99 within budget)")
    ax.set_title(f"{name}: tuning grid (budget p99 <= {budget_ms:g} ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _fmt(value: Any) -> str:
    return "–" if value is None else (f"{value:,.2f}" if isinstance(value, float) else str(value))


def generation_ratio_lines(result: dict[str, Any]) -> list[str]:
    r, name = result["ratios"], result["model"]
    top = max(result["bench"]["concurrency"])
    lines = [
        f"{name} stream: TTFT p50 at concurrency {top} = {_fmt(r[f'ttft_p50_ms_c{top}'])} ms; lone stream / in-process generate() = "
        f"{_fmt(r['stream_c1_vs_inprocess'])} (goal >= {GOALS['stream_c1_vs_inprocess']})"
    ]
    if r["stream_vs_static"]:
        per_level = ", ".join(f"c{c}: {_fmt(v)}" for c, v in r["stream_vs_static"].items())
        lines.append(f"{name} stream / static tokens/s = {per_level} (goal >= {GOALS['stream_vs_static']} at c{top})")
    if r["errors"]:
        lines.append(f"{name}: {r['errors']} requests failed during the run (see first_error in the JSON)")
    return lines


def generation_section(result: dict[str, Any], plots: dict[str, str]) -> list[str]:
    lines = [
        f"## {result['model']} — streaming generation (continuous batching, max_sequences {result['max_sequences']}), "
        f"{result['instances']} x {', '.join(result['instance_kind'])}",
        "",
        f"Measured on {result['host']['name']} ({result['host']['cpus']} CPUs, GPU: {result['host']['gpu']}) by {result['tool']}; "
        f"{result['corpus']['prompts']} corpus prompts, max_new_tokens cycled from {result['corpus']['max_new_tokens']}, "
        f"{result['bench']['generation_requests']} prompts per client per cell. The static baseline is the same model with "
        f"streaming: false (max_batch_size {result['static_max_batch_size']}) on a scratch server: its first token is its whole answer. "
        "The load generator runs on the same machine as the server.",
        "",
        f"![throughput]({plots['throughput']})",
        f"![latency]({plots['latency']})",
        "",
        f"In-process generate(), the same requests one by one: {_fmt(result['inprocess']['items_per_s'])} tokens/s "
        f"({result['inprocess']['tokens']} tokens).",
        "",
        "| mode | clients | requests | tokens/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | total p50 ms | p99 ms | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in (*result["stream"], *result["static"]):
        t, i, lat = c["ttft_ms"], c["itl_ms"], c["latency_ms"]
        lines.append(
            f"| {c['mode']} | {c['concurrency']} | {c['requests']} | {_fmt(c['items_per_s'])} | {_fmt(t['p50'])} | {_fmt(t['p99'])} "
            f"| {_fmt(i['p50'])} | {_fmt(i['p99'])} | {_fmt(lat['p50'])} | {_fmt(lat['p99'])} | {c['errors']} |"
        )
    lines += ["", *openai_section(result), *guidellm_section(result), "Ratios:", "", *[f"- {line}" for line in ratio_lines(result)], ""]
    return lines


def guidellm_section(result: dict[str, Any]) -> list[str]:
    """guidellm's sweep through the gateway (perf/guidellm.py), or why it did not run."""
    sweep = result.get("guidellm")
    if not sweep:
        return []
    if "skipped" in sweep:
        return [f"guidellm through the gateway: not run ({sweep['skipped']}).", ""]
    lines = [
        f"### {sweep['tool']} through the gateway (its own load and counting; streamed /v1/completions)",
        "",
        "| strategy | rate req/s | requests ok / errored | mean concurrency | output tokens/s | TTFT p50 ms | TTFT p99 ms "
        "| ITL p50 ms | ITL p99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for b in sweep["benchmarks"]:
        t, i, r = b["ttft_ms"], b["itl_ms"], b["requests"]
        lines.append(
            f"| {b['strategy']} | {_fmt(b['rate'])} | {r['successful']} / {r['errored']} | {_fmt(b['concurrency'])} "
            f"| {_fmt(b['output_tokens_per_s'])} | {_fmt(t['p50'])} | {_fmt(t['p99'])} | {_fmt(i['p50'])} | {_fmt(i['p99'])} |"
        )
    return [*lines, ""]


def openai_ratio_lines(result: dict[str, Any]) -> list[str]:
    ratios = result["ratios"].get("openai") or {}
    if not ratios:
        return []
    alone = result["openai"]["alone"]
    lines = [
        f"{result['model']} OpenAI gateway alone ({alone['measures']}): {alone['added_p50_ms']:+.1f} ms at p50 "
        f"({alone['direct_p50_ms']:.1f} -> {alone['gateway_p50_ms']:.1f} ms)"
    ]
    for level, r in ratios.items():
        if not level.startswith("c"):
            continue
        cpu = f"; gateway CPU {_fmt(r['gateway_cpu_ms_per_request'])} ms per request"
        if "tokens_per_s_ratio" in r:
            lines.append(
                f"{result['model']} OpenAI gateway / direct gRPC at {level}: tokens/s {_fmt(r['tokens_per_s_ratio'])} "
                f"(goal >= {GOALS['openai_tokens_per_s']}), TTFT p50 {r['ttft_p50_added_ms']:+.1f} ms "
                f"(goal <= +{GOALS['openai_ttft_added_ms']:.0f}){cpu}"
            )
        else:
            lines.append(
                f"{result['model']} OpenAI gateway / direct gRPC at {level}: texts/s {_fmt(r['texts_per_s_ratio'])} "
                f"(goal >= {GOALS['openai_texts_per_s']}){cpu}"
            )
    return lines


def openai_section(result: dict[str, Any]) -> list[str]:
    """The gateway's cells next to direct gRPC, round by round."""
    cost = result.get("openai")
    if not cost:
        return []
    generation = "tokens_per_s_ratio" in cost["cells"][0]
    unit = "tokens/s" if generation else "texts/s"
    lines = [
        f"### Through the OpenAI gateway ({cost['endpoint']}) vs direct gRPC: same load, rounds alternate which goes first; "
        + ("p50 = time to first token" if generation else "p50 = request latency"),
        "",
        f"| clients | round | direct {unit} | gateway {unit} | ratio | direct p50 ms | gateway p50 ms | gateway CPU ms/request |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in cost["cells"]:
        for r in row["rounds"]:
            d, g = r["direct"], r["gateway"]
            key = "ttft_ms" if generation else "latency_ms"
            ratio = r["tokens_per_s_ratio" if generation else "texts_per_s_ratio"]
            lines.append(
                f"| {row['concurrency']} | {r['round']} | {_fmt(d['items_per_s'])} | {_fmt(g['items_per_s'])} | {_fmt(ratio)} "
                f"| {_fmt(d[key]['p50'])} | {_fmt(g[key]['p50'])} | {_fmt(g['gateway_cpu_ms_per_request'])} |"
            )
    return [*lines, ""]


def ratio_lines(result: dict[str, Any]) -> list[str]:
    """The ratios of one model, one line each, with the goal where the issue set one."""
    if result.get("streaming"):
        return [*generation_ratio_lines(result), *pipeline_ratio_lines(result), *openai_ratio_lines(result)]
    r, big = result["ratios"], result["max_batch_size"]
    top = max(result["bench"]["concurrency"])
    lines = []
    for protocol in result["bench"]["protocols"]:
        p = r[protocol]
        c1, best = p[f"served_batch{big}_c1_vs_raw"], p[f"served_batch{big}_best_vs_raw"]
        singles = p[f"single_text_c{top}_vs_raw_batch{big}"]
        best_part = (
            f"{_fmt(c1)} at concurrency 1 (also the best)"
            if p["best_at_concurrency"] == 1
            else f"{_fmt(c1)} at concurrency 1, {_fmt(best)} at concurrency {p['best_at_concurrency']}"
        )
        lines.append(
            f"{result['model']} {protocol}: served batch {big} / in-process batch {big} = {best_part} "
            f"(goal >= {GOALS['served_vs_raw']}); "
            f"single-text x{top} / in-process batch {big} = {_fmt(singles)} (goal >= {GOALS['singles_vs_raw']})"
        )
    for flagged in r.get("implausible") or []:
        lines.append(
            f"{result['model']}: IMPLAUSIBLE {flagged}: served faster than the in-process engine it runs; the yardstick "
            f"was not stable (a shared machine?) -- rerun `make bench FORCE=1`, this ratio proves no goal"
        )
    for backend, speedup in (r.get("inprocess_speedup_vs_python") or {}).items():
        if backend != "python":
            lines.append(f"{result['model']}: in-process {backend} / python at batch {big} = {speedup}")
    return [*lines, *pipeline_ratio_lines(result), *openai_ratio_lines(result)]


def pipeline_ratio_lines(result: dict[str, Any]) -> list[str]:
    """Served against transformers' own pipeline in this process (issue 43's goals)."""
    r = result["ratios"].get("pipeline")
    if not r:
        return []
    unit = f"{result['items']}/s"
    lines = [
        f"{result['model']} pipeline('{result['task']}') in-process: {_fmt(r['pipeline_batch1_items_per_s'])} {unit} one at a time, "
        f"{_fmt(r['pipeline_best_batched_items_per_s'])} {unit} at its best batch"
    ]
    for key, cell in r.items():
        if isinstance(cell, dict):
            protocol, clients = key.split("_c")
            lines.append(
                f"{result['model']} {protocol} {clients} clients: served {_fmt(cell['served_items_per_s'])} {unit} "
                f"({cell['request_texts']} per request) = {_fmt(cell['vs_pipeline_batch1'])}x the pipeline's batch-1 loop "
                f"(goal >= {GOALS['vs_pipeline_batch1']}), {_fmt(cell['vs_pipeline_best_batched'])}x its best batch "
                f"(goal >= {GOALS['vs_pipeline_best_batched']})"
            )
    return lines


def model_section(result: dict[str, Any], plots: dict[str, str]) -> list[str]:
    big = result["max_batch_size"]
    lines = [
        f"## {result['model']} — {result['task']}, backend {result['backend']}, {result['instances']} x "
        f"{', '.join(result['instance_kind'])}, max_batch_size {big}, queue delay {result['max_queue_delay_us']} µs",
        "",
        f"Measured by **{result['tool']}** on {result['host']['name']} ({result['host']['cpus']} CPUs, GPU: {result['host']['gpu']}); "
        f"{result['corpus']['texts']} corpus texts of {result['corpus']['words_min']}–{result['corpus']['words_max']} words; "
        f"{result['bench']['seconds']} s per cell. Items = {result['items']}.",
        "",
        f"![throughput]({plots['throughput']})",
        f"![latency]({plots['latency']})",
        "",
        "In-process (the yardstick: the same engine model.py runs, no server):",
        "",
        "| backend | batch | items/s | p50 ms per call |",
        "|---|---|---|---|",
    ]
    for backend, by_batch in result["raw"].items():
        if backend == "device":
            continue
        for batch, figures in by_batch.items():
            lines.append(f"| {backend} | {batch} | {_fmt(figures['items_per_s'])} | {_fmt(figures['latency_ms']['p50'])} |")
    lines += [
        "",
        "Served:",
        "",
        "| protocol | texts/request | concurrency | items/s | requests/s | p50 ms | p90 ms | p99 ms | errors "
        "| server queue µs | compute in µs | infer µs | out µs | texts/execution |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result["served"]:
        s, lat = c["server"], c["latency_ms"]
        lines.append(
            f"| {c['protocol']} | {c['request_texts']} | {c['concurrency']} | {_fmt(c['items_per_s'])} | {_fmt(c['requests_per_s'])} "
            f"| {_fmt(lat['p50'])} | {_fmt(lat['p90'])} | {_fmt(lat['p99'])} | {c['errors']} | {_fmt(s.get('queue_us'))} "
            f"| {_fmt(s.get('compute_input_us'))} | {_fmt(s.get('compute_infer_us'))} | {_fmt(s.get('compute_output_us'))} "
            f"| {_fmt(s.get('avg_batch_texts'))} |"
        )
    lines += ["", *openai_section(result), "Ratios:", "", *[f"- {line}" for line in ratio_lines(result)], ""]
    return lines


def bench_step(results: list[str], output_md: str, output_summary: str, plot_dir: str) -> dict[str, Any]:
    """Rule bench: plots per model, report.md, summary.json (ratios); prints the ratios."""
    plot_root = Path(plot_dir)
    plot_root.mkdir(parents=True, exist_ok=True)
    loaded = [json.loads(Path(p).read_text()) for p in results]
    lines = ["# hf2triton bench", "", "Regenerate: `snakemake --cores 1 bench` (or `make bench`).", ""]
    summary: dict[str, Any] = {"models": {}, "lines": []}
    for path, result in zip(results, loaded):
        plots = {kind: plot_root / f"{Path(path).stem}-{kind}.png" for kind in ("throughput", "latency")}
        relative = {k: str(Path(v).relative_to(Path(output_md).parent)) for k, v in plots.items()}
        if result.get("streaming"):
            plot_generation(result, plots)
            lines += generation_section(result, relative)
        else:
            plot_throughput(result, plots["throughput"])
            plot_latency(result, plots["latency"])
            lines += model_section(result, relative)
        summary["models"][Path(path).stem] = result["ratios"]
        summary["lines"] += ratio_lines(result)
    atomic_write_text(output_md, "\n".join(lines) + "\n")
    atomic_write_json(output_summary, summary)
    print("\nhf2triton bench: ratios (measured side by side in this run)", flush=True)
    for line in summary["lines"]:
        print(f"  {line}", flush=True)
    print(f"report: {output_md}", flush=True)
    return summary
