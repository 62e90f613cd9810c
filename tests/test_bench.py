"""`bench` and `tune` as real snakemake runs against the real server, at tiny scale (a few seconds per
model). Outputs are schema-checked; no timing assertions (speed is judged by `make bench`, not by tests)."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from hf2triton import host
from hf2triton.config import load_config
from hf2triton.triton import client

pytestmark = pytest.mark.integration

TINY_BENCH = {
    "concurrency": [1, 2],
    "seconds": 0.5,
    "warmup_s": 0.1,
    "max_requests": 200,
    "max_new_tokens": 4,
    "generation_max_new_tokens": [4, 12],
    "generation_requests": 2,
}
TINY_TUNE = {"models": ["embed"], "max_batch_size": [2, 4], "instances": [1], "max_queue_delay_us": [0], "concurrency": 4, "seconds": 0.5}
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def measured(tiny_workflow):
    """The shared tiny workflow with bench/tune settings added for the test, restored afterwards (they
    are no params of the serve chain, so serving stays current)."""
    saved = copy.deepcopy(tiny_workflow.config)
    tiny_workflow.config.update(bench=TINY_BENCH, tune=TINY_TUNE)
    yield tiny_workflow
    tiny_workflow.config = saved
    tiny_workflow.write_config()


def check_gateway_cost(data: dict, users_gateway: str) -> None:
    """The gateway-cost stage: a private gateway (not the users'), rounds alternating which side goes first, both
    sides measured with the gateway's own CPU time, and the unloaded per-request latencies side by side."""
    ratio = "tokens_per_s_ratio" if data["task"] == "text-generation" else "texts_per_s_ratio"
    (row,) = data["openai"]["cells"]
    assert data["openai"]["gateway"] != users_gateway and row["concurrency"] == 1 and row["errors"] == 0, row
    assert [r["order"][0] for r in row["rounds"]] == ["direct", "gateway"], "rounds alternate which side goes first"
    for measured in row["rounds"]:
        assert measured["gateway"]["protocol"] == "openai" and measured["gateway"]["items_per_s"] > 0
        assert measured["direct"]["protocol"] == "grpc" and measured["direct"]["items_per_s"] > 0
        assert measured["gateway"]["gateway_cpu_ms_per_request"] is not None, "the gateway's own CPU time is read from /proc"
    assert data["ratios"]["openai"]["c1"][ratio] > 0
    alone = data["openai"]["alone"]
    assert alone["pairs"] == 20 and alone["direct_p50_ms"] > 0 and alone["gateway_p50_ms"] > 0, alone


def check_guidellm(data: dict) -> None:
    """Issue 44: guidellm's sweep ran through the bench's own gateway (its key from the environment) to the end:
    one request at a time, the top concurrency, two constant rates, each with TTFT and ITL."""
    sweep = data["guidellm"]
    assert "skipped" not in sweep, sweep
    assert "--rate-type" in sweep["command"] and not any("key" in part.lower() for part in sweep["command"]), "no key on its command line"
    assert [b["strategy"] for b in sweep["benchmarks"]] == ["synchronous", "throughput", "constant", "constant"], sweep
    for benchmark in sweep["benchmarks"]:
        assert benchmark["requests"]["successful"] >= 1 and benchmark["requests"]["errored"] == 0, benchmark
        assert benchmark["ttft_ms"]["p50"] > 0 and benchmark["itl_ms"]["p50"] > 0 and benchmark["output_tokens_per_s"] > 0, benchmark


def check_streaming_generation(data: dict) -> None:
    """The streaming model's cells: streamed and static (scratch server) over the same mixed load."""
    assert data["task"] == "text-generation" and data["streaming"] and data["inprocess"]["items_per_s"] > 0
    for mode in ("stream", "static"):
        cells = sorted(data[mode], key=lambda c: c["concurrency"])
        assert [(c["mode"], c["concurrency"], c["requests"]) for c in cells] == [(mode, 1, 2), (mode, 2, 4)]
        for cell in cells:
            assert cell["errors"] == 0 and cell["items_per_s"] > 0, cell
            assert 0 < cell["ttft_ms"]["p50"] <= cell["latency_ms"]["p50"] + 1e-6 or mode == "static"
            assert cell["ttft_ms"]["p50"] <= cell["ttft_ms"]["p99"]
    assert all(c["itl_ms"]["p50"] > 0 for c in data["stream"]), "streams arrive in pieces"
    ratios = data["ratios"]
    assert ratios["stream_c1_vs_inprocess"] > 0 and set(ratios["stream_vs_static"]) == {"1", "2"} and ratios["ttft_p50_ms_c2"] > 0


def test_tune_writes_an_overlay_the_config_accepts(measured):
    result = measured.run("tune")
    assert measured.jobs_run(result) == ["tune"]
    out = measured.directory / "results" / "tune"
    results = json.loads((out / "results.json").read_text())
    entry = results["models"]["embed"]
    ids = {row["id"] for row in entry["rows"]}
    assert ids == {"python-b4-i1-d20000", "python-b2-i1-d0", "python-b4-i1-d0"}, "the grid plus the current settings"
    assert entry["baseline"] == "python-b4-i1-d20000" and entry["best"] in ids and entry["gain_vs_current"] > 0
    for row in entry["rows"]:
        assert row["cell"]["errors"] == 0 and row["cell"]["items_per_s"] > 0 and row["ready_after_s"] > 0
        assert row["solo"]["concurrency"] == 1 and row["solo"]["requests"] > 0, "each variant is also measured alone"
    overlay = yaml.safe_load((out / "overlay.yaml").read_text())
    best = next(row["variant"] for row in entry["rows"] if row["id"] == entry["best"])
    assert overlay["overrides"]["embed"] == {
        "backend": best["backend"],
        "max_batch_size": best["max_batch_size"],
        "instances": best["instances"],
        "dynamic_batching": {"max_queue_delay_us": best["max_queue_delay_us"]},
    }
    assert (out / "plots" / "embed-grid.png").read_bytes().startswith(PNG) and "(current)" in (out / "report.md").read_text()
    applied = load_config(measured.config_file, overlay)
    embed = next(m for m in applied["models"] if m["name"] == "embed")
    assert embed["max_batch_size"] == best["max_batch_size"]
    # Applying an overlay that changes the model re-renders only that model (params reach the rule).
    measured.config["overrides"] = {"embed": {"max_batch_size": 3}}
    dry = measured.run("-n", "serve")
    assert measured.jobs_run(dry).count("repository") == 1 and "output: model_repository/embed" in dry.stdout
    assert measured.state()["models"] == ["embed", "classify", "generate"], "the served server was not touched"


def test_bench_writes_json_plots_report_and_ratios_through_a_gateway_of_its_own(measured):
    """One bench run of the three models (the suite's longest step, so the two stories share it): its files, plots,
    report and ratios; and issue 24 #15: bench used to go through ensure_gateway, so anything that differed between
    the bench and the running gateway (here: another $HF2TRITON_API_KEY in the bench's shell) restarted the gateway
    users talk to -- with the bench's key, so their requests got 401 -- and the gateway-cost stage measured whatever
    that gateway pointed at. Now bench measures a private gateway in front of the same Triton, after the static
    baseline as in the report, and the users' gateway keeps its pid, its key and its answers."""
    from hf2triton.gateway.process import state_file, stop_gateway

    measured.config["openai"] = {"enabled": True, "port": host.free_ports(1)[0]}
    settings = measured.settings()
    try:
        measured.run("serve")
        pid, users = measured.state()["pid"], json.loads(state_file(settings).read_text())["pid"]
        base = f"http://127.0.0.1:{measured.config['openai']['port']}/v1"
        measured.config["bench"] = {**TINY_BENCH, "openai_concurrency": [1], "openai_rounds": 2}
        measured.env["HF2TRITON_API_KEY"] = "another-key-in-the-bench-shell"
        try:
            result = measured.run("bench")
        finally:
            measured.env.pop("HF2TRITON_API_KEY")
        assert set(measured.jobs_run(result)) == {"bench_model", "bench"}, "nothing of the serve chain reruns"
        assert measured.state()["pid"] == pid, "bench uses the running server"
        assert json.loads(state_file(settings).read_text())["pid"] == users and host.process_cmdline(users) is not None
        assert client.http_get(f"{base}/models")[0] == 200, "the users' gateway still answers without a key"
        out = measured.directory / "results" / "bench"
        check_served_cells(out)
        for name in ("generate", "embed"):
            check_gateway_cost(json.loads((out / f"{name}.json").read_text()), base)
        generated = json.loads((out / "generate.json").read_text())
        check_streaming_generation(generated)
        streamed = generated["openai"]["cells"][0]["rounds"][0]["gateway"]
        assert streamed["ttft_ms"]["p50"] > 0 and streamed["gateway_cpu_us_per_token"] is not None
        assert "openai" not in json.loads((out / "classify.json").read_text()), "the gateway serves no classifiers"
        check_guidellm(generated)
        for kind in ("throughput", "latency"):
            assert (out / "plots" / f"generate-{kind}.png").read_bytes().startswith(PNG)
        report = (out / "report.md").read_text()
        assert report.count("![throughput](plots/") == 3 and "| grpc | 4 | 2 |" in report
        assert "| stream | 2 | 4 |" in report and "| static | 2 | 4 |" in report and "TTFT p50" in report
        assert "guidellm 0.3.1 through the gateway" in report and "Through the OpenAI gateway" in report
        summary = json.loads((out / "summary" / "ratios.json").read_text())
        assert set(summary["models"]) == {"embed", "classify", "generate"} and len(summary["lines"]) >= 6
        assert "single-text x2 / in-process batch 4" in result.stdout + result.stderr, "ratios printed at the end"
        assert "OpenAI gateway / direct gRPC at c1: tokens/s" in result.stdout
        marker = ["-m", "hf2triton.gateway", "--grpc", settings.url("grpc_port")]
        assert [p for p in host.pids() if (host.process_cmdline(p) or [])[1:5] == marker] == [users], "the bench's own gateways are gone"
        again = measured.run("bench")
        assert measured.jobs_run(again) == [], "measurements are files: a second bench reruns nothing"
        measured.config["bench"] = {**measured.config["bench"], "seconds": 0.6}
        dry = measured.jobs_run(measured.run("-n", "bench"))
        assert sorted(dry) == ["bench", "bench_model", "bench_model", "bench_model"], "bench settings reach the rule as params"
    finally:
        stop_gateway(settings)


def check_served_cells(out) -> None:
    """The encoder and the classifier: every protocol x texts per request x concurrency cell, the in-process raw
    figures, Triton's own statistics and metrics, the ratios, and the plots."""
    for name, task in (("embed", "feature-extraction"), ("classify", "text-classification")):
        data = json.loads((out / f"{name}.json").read_text())
        assert data["task"] == task and data["max_batch_size"] == 4
        assert "tritonclient" in data["tool"] or "perf_analyzer" in data["tool"]
        assert data["raw"]["python"]["1"]["items_per_s"] > 0 and data["raw"]["python"]["4"]["calls"] >= 3
        cells = {(c["protocol"], c["request_texts"], c["concurrency"]) for c in data["served"]}
        assert cells == {(p, s, c) for p in ("http", "grpc") for s in (1, 4) for c in (1, 2)}
        for cell in data["served"]:
            assert cell["errors"] == 0 and cell["requests"] > 0 and cell["items_per_s"] > 0, cell
            assert cell["requests"] <= TINY_BENCH["max_requests"]
            assert cell["latency_ms"]["p50"] <= cell["latency_ms"]["p99"] <= cell["latency_ms"]["max"]
            assert cell["server"]["compute_infer_us"] > 0 and cell["server"]["avg_batch_texts"] >= 1
        assert data["metrics"]["counters_delta"]["nv_inference_request_success"] > 0
        ratios = data["ratios"]
        for protocol in ("http", "grpc"):
            assert ratios[protocol]["served_batch4_c1_vs_raw"] > 0 and ratios[protocol]["single_text_c2_vs_raw_batch4"] > 0
        for kind in ("throughput", "latency"):
            assert (out / "plots" / f"{name}-{kind}.png").read_bytes().startswith(PNG)
