"""`snakemake tune`: sweep backend x max_batch_size x instances x max_queue_delay for a model on a scratch
tritonserver (own ports on 127.0.0.1, own repository under results/tune/), measure each variant with the
same load generator as `bench`, pick the best throughput whose p99 stays inside the latency budget, and
write a config overlay the user can adopt (`overrides:` by model name).

The served server of `make serve` is not touched; variants load one at a time, so memory stays at one
extra copy of the model.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from pathlib import Path
from typing import Any

import yaml

from hf2triton import host
from hf2triton.fsutil import atomic_write_json, atomic_write_text
from hf2triton.perf import loadgen
from hf2triton.perf.bench import token_counter
from hf2triton.perf.corpus import bench_texts
from hf2triton.perf.scratch import scratch_server
from hf2triton.serving import interface
from hf2triton.specs import ModelSpec, ServerSpec, TuneSpec, from_param, with_variant

log = logging.getLogger(__name__)

SOLO_SECONDS = 2.0
TUNED_KEYS = ("backend", "max_batch_size", "instances", "max_queue_delay_us")


def variant_id(variant: dict[str, Any]) -> str:
    return f"{variant['backend']}-b{variant['max_batch_size']}-i{variant['instances']}-d{variant['max_queue_delay_us']}"


def current_variant(model: ModelSpec) -> dict[str, Any]:
    return {key: getattr(model, key) for key in TUNED_KEYS}


def can_serve(variant: dict[str, Any], request_texts: int) -> bool:
    """A batching model takes at most max_batch_size texts per request; max_batch_size 0 (no batching)
    takes any number."""
    return variant["max_batch_size"] == 0 or variant["max_batch_size"] >= request_texts


def grid(model: ModelSpec, tune: TuneSpec) -> list[dict[str, Any]]:
    """Every combination (the model's current settings included), minus the ones that cannot serve the
    tuning load (a request of more texts than max_batch_size)."""
    backends = tune.backends or (model.backend,)
    combos = [
        dict(zip(TUNED_KEYS, values))
        for values in itertools.product(backends, tune.max_batch_size, tune.instances, tune.max_queue_delay_us)
    ]
    current = current_variant(model)
    if current not in combos:
        combos.insert(0, current)
    return [c for c in combos if can_serve(c, tune.request_texts)]


def pick(rows: list[dict[str, Any]], budget_ms: float) -> tuple[dict[str, Any] | None, str]:
    """Best throughput among error-free variants whose p99 is inside the budget."""
    fine = [r for r in rows if r.get("cell") and r["cell"]["errors"] == 0]
    inside = [r for r in fine if r["cell"]["latency_ms"]["p99"] <= budget_ms]
    if inside:
        return max(inside, key=lambda r: r["cell"]["items_per_s"]), f"best throughput with p99 <= {budget_ms:g} ms"
    if fine:
        return min(fine, key=lambda r: r["cell"]["latency_ms"]["p99"]), f"no variant met p99 <= {budget_ms:g} ms: lowest p99 chosen"
    return None, "no variant served the load without errors"


def measure_variant(
    model: ModelSpec,
    variant: dict[str, Any],
    paths: dict[str, str],
    root: Path,
    server: ServerSpec,
    tune: TuneSpec,
    texts: list[bytes],
    counter,
    gpu_available: bool,
) -> dict[str, Any]:
    """Render the variant into its own repository, serve it alone on a scratch server, load-test it."""
    name = model.name
    repository = root / "variants" / variant_id(variant)
    with scratch_server(with_variant(model, **variant), repository, root / "server", server, paths, gpu_available) as (settings, load_s):
        extra = {interface.MAX_NEW_TOKENS: model.generation.max_new_tokens} if model.generation else None
        load = loadgen.Load(
            "grpc", settings.urls, name, texts, tune.request_texts, tune.concurrency, tune.seconds, tune.max_requests, extra
        )
        cell = loadgen.measure_tritonclient(load, warmup_s=1.0, count_tokens=counter)
        # The same variant under no load: what a queue delay or a big batch costs a lone request.
        solo = loadgen.measure_tritonclient(
            dataclasses.replace(load, concurrency=1, seconds=min(tune.seconds, SOLO_SECONDS)), warmup_s=0.2, count_tokens=counter
        )
    log.info(
        "%s %s: %.1f items/s, p99 %.1f ms, %d errors (ready after %.1f s)",
        name, variant_id(variant), cell.items_per_s, cell.latency_ms["p99"], cell.errors, load_s,
    )  # fmt: skip
    return {"variant": variant, "id": variant_id(variant), "ready_after_s": load_s, "cell": cell.to_dict(), "solo": solo.to_dict()}


def overlay_for(variant: dict[str, Any]) -> dict[str, Any]:
    return {
        "backend": variant["backend"],
        "max_batch_size": variant["max_batch_size"],
        "instances": variant["instances"],
        "dynamic_batching": {"max_queue_delay_us": variant["max_queue_delay_us"]},
    }


def artifacts_by_model(inputs: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The rule's named inputs `<model>__<kind>` -> {model: {kind: path}}."""
    artifacts: dict[str, dict[str, str]] = {}
    for key, path in inputs.items():
        if "__" in key:
            name, kind = key.rsplit("__", 1)
            artifacts.setdefault(name, {})[kind] = str(path)
    return artifacts


def tune_step(
    models: list[dict[str, Any]], inputs: dict[str, Any], server: dict[str, Any], tune: dict[str, Any], gpu_available: bool, **outputs: str
) -> dict[str, Any]:
    """Rule tune (specs arrive as params dicts; outputs: output_overlay, output_json, output_md, plot_dir)."""
    specs = [from_param(ModelSpec, m) for m in models]
    return tune_models(
        specs, artifacts_by_model(inputs), from_param(ServerSpec, server), from_param(TuneSpec, tune), gpu_available, **outputs
    )


def tune_models(
    models: list[ModelSpec],
    artifacts: dict[str, dict[str, str]],
    server: ServerSpec,
    tune: TuneSpec,
    gpu_available: bool,
    output_overlay: str,
    output_json: str,
    output_md: str,
    plot_dir: str,
    scratch_dir: str = "",
) -> dict[str, Any]:
    """The sweep for every tuned model, the overlay, the report. Variant repositories and scratch servers
    live under `scratch_dir` (default: next to output_json)."""
    root = Path(scratch_dir or Path(output_json).parent / "scratch")
    texts = [t.encode() for t in bench_texts(512)]
    results: dict[str, Any] = {"tune": dataclasses.asdict(tune), "host": {"cpus": host.cpu_count(), "gpu": gpu_available}, "models": {}}
    overrides: dict[str, Any] = {}
    for model in models:
        counter = None
        if model.is_generation:
            from transformers import AutoTokenizer

            counter = token_counter(AutoTokenizer.from_pretrained(artifacts[model.name]["pretrained"]))
        variants = grid(model, tune)
        log.info(
            "tuning %s: %d variants, %d-text requests at concurrency %d", model.name, len(variants), tune.request_texts, tune.concurrency
        )
        rows = [
            measure_variant(model, v, artifacts[model.name], root / model.name, server, tune, texts, counter, gpu_available)
            for v in variants
        ]
        best, why = pick(rows, tune.latency_budget_ms)
        baseline = next((r for r in rows if r["variant"] == current_variant(model)), None)
        entry = {"rows": rows, "baseline": baseline["id"] if baseline else None, "best": best["id"] if best else None, "why": why}
        if baseline is None:
            entry["why"] += (
                f"; the current settings cannot serve {tune.request_texts}-text requests (max_batch_size {model.max_batch_size})"
            )
        if best:
            if baseline:
                entry["gain_vs_current"] = round(best["cell"]["items_per_s"] / max(baseline["cell"]["items_per_s"], 1e-9), 3)
            overrides[model.name] = overlay_for(best["variant"])
        results["models"][model.name] = entry
    header = (
        "# hf2triton tuning overlay (written by `snakemake --cores 1 tune`; see results/tune/report.md).\n"
        "# Adopt it: `make serve OVERLAY=results/tune/overlay.yaml`, or\n"
        "#           `snakemake --cores 1 serve --configfile results/tune/overlay.yaml`, or copy the values into config.yaml.\n"
    )
    atomic_write_text(output_overlay, header + yaml.safe_dump({"overrides": overrides}, sort_keys=False))
    atomic_write_json(output_json, results)
    write_tune_report(results, output_md, Path(plot_dir))
    for name, entry in results["models"].items():
        gain = entry.get("gain_vs_current")
        print(f"hf2triton tune {name}: best {entry['best']} ({entry['why']}), x{gain} vs current {entry['baseline']}")
        alone = {row["id"]: row["solo"]["latency_ms"]["p50"] for row in entry["rows"]}
        if entry["best"] and entry["baseline"]:
            print(f"  a lone request: p50 {alone[entry['best']]} ms chosen vs {alone[entry['baseline']]} ms current")
    print(f"overlay: {output_overlay}")
    return results


def write_tune_report(results: dict[str, Any], output_md: str, plot_dir: Path) -> None:
    from hf2triton.perf.report import plot_tune_grid

    tune = results["tune"]
    lines = [
        "# hf2triton tuning sweep",
        "",
        f"Load: {tune['request_texts']}-text requests over gRPC at concurrency {tune['concurrency']}, {tune['seconds']} s per variant, "
        f"p99 budget {tune['latency_budget_ms']} ms; each variant alone on a scratch server ({results['host']['cpus']} CPUs, GPU: "
        f"{results['host']['gpu']}).",
        "",
    ]
    plot_dir.mkdir(parents=True, exist_ok=True)
    for name, entry in results["models"].items():
        plot = plot_dir / f"{name}-grid.png"
        plot_tune_grid(name, entry, tune["latency_budget_ms"], plot)
        lines += [
            f"## {name}",
            "",
            f"Chosen: **{entry['best']}** ({entry['why']}); {entry.get('gain_vs_current')}x the throughput of the current "
            f"settings ({entry['baseline']}).",
            "",
            f"![grid]({plot.relative_to(Path(output_md).parent)})",
            "",
            "The last two columns are the same variant under no load (one request at a time): what its queue delay",
            "and batch size cost a lone request.",
            "",
            "| variant | items/s | p50 ms | p99 ms | errors | server queue µs | infer µs | texts/execution | ready after s "
            "| alone: items/s | alone: p50 ms |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in sorted(entry["rows"], key=lambda r: -r["cell"]["items_per_s"]):
            c, solo, mark = row["cell"], row["solo"], " (current)" if row["id"] == entry["baseline"] else ""
            lines.append(
                f"| {row['id']}{mark} | {c['items_per_s']:,.1f} | {c['latency_ms']['p50']:,.1f} | {c['latency_ms']['p99']:,.1f} | "
                f"{c['errors']} | {c['server'].get('queue_us', 0):,.0f} | {c['server'].get('compute_infer_us', 0):,.0f} | "
                f"{c['server'].get('avg_batch_texts', 0)} | {row['ready_after_s']} | {solo['items_per_s']:,.1f} | "
                f"{solo['latency_ms']['p50']:,.1f} |"
            )
        lines.append("")
    atomic_write_text(output_md, "\n".join(lines) + "\n")
