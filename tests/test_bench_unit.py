"""bench / tune logic without a server: corpus, statistics arithmetic, perf_analyzer parsing, the tuning
grid and pick, config overlays."""

from __future__ import annotations

import subprocess

import pytest

from hf2triton.config import load_config
from hf2triton.errors import UserError
from hf2triton.perf import loadgen
from hf2triton.perf.bench import ratios
from hf2triton.perf.corpus import bench_texts
from hf2triton.perf.pipelines import pipeline_ratios, task_load
from hf2triton.perf.report import ratio_lines
from hf2triton.perf.tune import current_variant, grid, pick, tune_models, variant_id
from hf2triton.specs import BenchSpec, ModelSpec, ServerSpec, TuneSpec

# The CSV layout perf_analyzer 2.60 writes with -f (values in microseconds).
PERF_ANALYZER_CSV = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,Avg latency,"
    "request/response,response wait\n"
    "8,6012.5,40,900,2100,30,1800,25,10,4800,5600,5900,6400,4900,0,0\n"
)


def test_corpus_is_fixed_and_realistic():
    texts = bench_texts(200)
    assert texts == bench_texts(200), "seeded: the same texts every run"
    words = [len(t.split()) for t in texts]
    assert min(words) >= 20 and max(words) <= 90
    assert any(not t.isascii() for t in bench_texts(512)), "includes non-English text"
    assert bench_texts(10, seed=1) != bench_texts(10, seed=0)


def test_server_breakdown_is_per_request_average():
    before = {"success_count": 10, "queue_ns": 1_000_000, "compute_infer_ns": 5_000_000, "execution_count": 5, "inference_count": 10}
    after = {"success_count": 30, "queue_ns": 5_000_000, "compute_infer_ns": 45_000_000, "execution_count": 10, "inference_count": 70}
    out = loadgen.server_breakdown(before, after)
    assert out["queue_us"] == 200.0 and out["compute_infer_us"] == 2000.0
    assert out["requests"] == 20 and out["executions"] == 5 and out["avg_batch_texts"] == 12.0


def test_perf_analyzer_csv_parsed_to_the_same_record():
    parsed = loadgen.parse_perf_analyzer_csv(PERF_ANALYZER_CSV)
    assert parsed["items_per_s"] == 6012.5
    assert parsed["latency_ms"]["p99"] == 6.4 and parsed["latency_ms"]["p50"] == 4.8
    assert parsed["latency_ms"]["max"] is None, "perf_analyzer reports no maximum: not p99 under another name"
    assert parsed["server"]["queue_us"] == 2100 and parsed["server"]["compute_infer_us"] == 1800


def test_perf_analyzer_input_batches_single_texts():
    data = loadgen.perf_analyzer_input([b"hello", "café".encode()], {"max_new_tokens": 4})["data"]
    assert data[1]["text"] == {"content": ["café"], "shape": [1]}
    assert data[0]["max_new_tokens"] == {"content": [4], "shape": [1]}


@pytest.mark.parametrize("url", ["10.0.0.5:8001", "example.com:8000", "0.0.0.0:8000"])
def test_load_only_targets_loopback(url):
    load = loadgen.Load("grpc", {"grpc": url, "http": url}, "m", [b"x"], 1, 1, 1.0, 10)
    with pytest.raises(UserError, match="not on 127.0.0.1"):
        _ = load.url


def test_percentiles():
    out = loadgen.percentiles([0.001 * i for i in range(1, 101)])
    assert out["p50"] == pytest.approx(50.5) and out["p99"] == pytest.approx(99.01) and out["max"] == 100.0
    assert loadgen.percentiles([])["p99"] == 0.0


def _model(**extra):
    values = {"name": "m", "source": "org/m", "task": "feature-extraction", "max_batch_size": 8, "max_queue_delay_us": 100, **extra}
    return ModelSpec(**values)


def test_grid_includes_current_settings_and_drops_impossible_variants():
    tune = TuneSpec(backends=(), max_batch_size=(1, 4), instances=(1, 2), max_queue_delay_us=(0,), request_texts=2)
    variants = grid(_model(), tune)
    assert current_variant(_model()) in variants
    assert all(v["max_batch_size"] >= 2 for v in variants), "a 2-text request cannot go to max_batch_size 1"
    assert len(variants) == 1 + 2  # current + (4 x {1, 2} x 0)
    assert variant_id(variants[0]) == "python-b8-i1-d100"


def _row(ident, rate, p99, errors=0):
    return {"id": ident, "cell": {"items_per_s": rate, "errors": errors, "latency_ms": {"p99": p99}}}


def test_pick_respects_budget_and_errors():
    rows = [_row("fast-but-slow-tail", 100, 900), _row("good", 80, 100), _row("broken", 200, 10, errors=3)]
    best, why = pick(rows, budget_ms=500)
    assert best["id"] == "good" and "p99 <= 500" in why
    best, why = pick(rows, budget_ms=50)
    assert best["id"] == "good" and "no variant met" in why
    assert pick([_row("broken", 1, 1, errors=1)], 10)[0] is None


def test_ratios_side_by_side():
    cell = {"protocol": "grpc", "request_texts": 32, "concurrency": 1, "items_per_s": 95.0}
    result = {
        "backend": "onnx",
        "max_batch_size": 32,
        "bench": {"concurrency": [1, 16], "protocols": ["grpc"]},
        "raw": {"device": "cpu", "onnx": {"1": {"items_per_s": 50}, "32": {"items_per_s": 100}}, "python": {"32": {"items_per_s": 50}}},
        "served": [
            cell,
            {**cell, "concurrency": 16, "items_per_s": 110.0},
            {**cell, "request_texts": 1, "concurrency": 16, "items_per_s": 92.0},
        ],
    }
    out = ratios(result)
    assert out["grpc"]["served_batch32_c1_vs_raw"] == 0.95 and out["grpc"]["served_batch32_best_vs_raw"] == 1.1
    assert out["grpc"]["single_text_c16_vs_raw_batch32"] == 0.92
    assert out["inprocess_speedup_vs_python"] == {"onnx": 2.0, "python": 1.0}


def test_task_loads_carry_what_each_task_needs(tmp_path):
    from transformers import AutoTokenizer

    from tests.helpers import minilm_dir

    AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(tmp_path)
    texts = bench_texts(20)
    ranking = task_load("text-ranking", texts, str(tmp_path))
    assert ranking.rows == texts and ranking.options["query"] and ranking.items == "documents"
    masked = task_load("fill-mask", texts, str(tmp_path))
    assert all(text.split().count("[MASK]") == 1 for text in masked.rows) and masked.options == {}
    assert task_load("token-classification", texts, str(tmp_path)).encoded == [t.encode() for t in texts]


def test_image_and_speech_loads_are_distinct_files_in_their_tensor():
    """The bench's image and speech loads: synthetic JPEG photos / 5 s WAV files the server decodes, in IMAGE / AUDIO."""
    import io

    import soundfile
    from PIL import Image

    photos = task_load("zero-shot-image-classification", [], "unused")
    assert photos.primary == "image" and photos.items == "images" and photos.options["candidate_labels"]
    assert len(set(photos.rows)) >= 4 and Image.open(io.BytesIO(photos.rows[0])).size == (640, 480)
    assert task_load("image-classification", [], "unused").options == {}
    speech = task_load("automatic-speech-recognition", [], "unused")
    assert speech.primary == "audio" and len(set(speech.rows)) == len(speech.rows) == 32
    info = soundfile.info(io.BytesIO(speech.rows[0]))
    assert (info.samplerate, round(info.duration, 2)) == (16000, 5.0)
    requests = loadgen.build_requests("grpc", speech.encoded, 2, speech.options, count=2, primary=speech.primary)
    assert [tensor.name() for tensor in requests[0]] == ["audio"] and requests[0][0].shape() == [2, 1]


def test_served_cells_against_the_pipeline_with_the_issues_goals():
    cell = {"protocol": "grpc", "request_texts": 1, "concurrency": 1, "items_per_s": 30.0}
    result = {
        "model": "ner",
        "task": "token-classification",
        "items": "texts",
        "max_batch_size": 32,
        "bench": {"concurrency": [1, 32], "protocols": ["grpc"]},
        "raw": {"pipeline": {"1": {"items_per_s": 10.0}, "8": {"items_per_s": 40.0}, "32": {"items_per_s": 50.0}}},
        "served": [cell, {**cell, "request_texts": 32, "items_per_s": 45.0}, {**cell, "concurrency": 32, "items_per_s": 60.0}],
    }
    out = pipeline_ratios(result)
    assert out["pipeline_batch1_items_per_s"] == 10.0 and out["pipeline_best_batched_items_per_s"] == 50.0
    assert out["grpc_c1"] == {"served_items_per_s": 45.0, "request_texts": 32, "vs_pipeline_batch1": 4.5, "vs_pipeline_best_batched": 0.9}
    assert out["grpc_c32"]["vs_pipeline_batch1"] == 6.0 and out["grpc_c32"]["vs_pipeline_best_batched"] == 1.2
    result["ratios"] = {"pipeline": out}
    from hf2triton.perf.report import pipeline_ratio_lines

    lines = pipeline_ratio_lines(result)
    assert "10.00 texts/s one at a time, 50.00 texts/s at its best batch" in lines[0], lines
    assert "= 4.50x the pipeline's batch-1 loop (goal >= 3.0), 0.90x its best batch (goal >= 0.9)" in lines[1], lines


def test_grid_keeps_an_unbatched_current_model():
    """Regression: max_batch_size 0 (no batching) takes requests of any size; the sweep kept it out and then
    lost every measurement with StopIteration looking for the current variant."""
    model = _model(max_batch_size=0)
    variants = grid(model, TuneSpec(max_batch_size=(8,), instances=(1,), max_queue_delay_us=(0,), request_texts=4))
    assert current_variant(model) in variants


def test_tune_without_a_measurable_current_variant_keeps_the_sweep(tmp_path, monkeypatch):
    """Regression: a current max_batch_size below tune.request_texts must not lose the sweep (StopIteration)."""
    from hf2triton.perf import tune as tune_module

    def fake_measure(model, variant, *args, **kwargs):
        cell = {"items_per_s": float(variant["max_batch_size"]), "errors": 0, "latency_ms": {"p50": 1.0, "p99": 2.0}, "server": {}}
        return {"variant": variant, "id": variant_id(variant), "ready_after_s": 0.1, "cell": cell, "solo": cell}

    monkeypatch.setattr(tune_module, "measure_variant", fake_measure)
    monkeypatch.setattr(tune_module, "write_tune_report", lambda *args: None)
    tune = TuneSpec(max_batch_size=(8, 16), instances=(1,), max_queue_delay_us=(0,), request_texts=4)
    out = tmp_path / "tune"
    results = tune_models(
        [_model(max_batch_size=2)], {"m": {"pretrained": "-"}}, ServerSpec(), tune, False,
        str(out / "overlay.yaml"), str(out / "results.json"), str(out / "report.md"), str(out / "plots"),
    )  # fmt: skip
    entry = results["models"]["m"]
    assert entry["best"] == "python-b16-i1-d0" and entry["baseline"] is None
    assert "current settings cannot serve 4-text requests" in entry["why"]
    assert "max_batch_size: 16" in (out / "overlay.yaml").read_text()


def _ratio_result(inprocess_batch, served):
    return {
        "model": "m",
        "backend": "python",
        "max_batch_size": 4,
        "bench": {"concurrency": [1, 4], "protocols": ["grpc"]},
        "raw": {"device": "cpu", "python": {"1": {"items_per_s": 5}, "4": {"items_per_s": inprocess_batch}}},
        "served": [{"protocol": "grpc", "request_texts": size, "concurrency": c, "items_per_s": v} for (size, c), v in served.items()],
    }


def test_ratio_lines_do_not_repeat_the_best_cell_and_flag_implausible_ratios():
    """Regression: the best batch cell at concurrency 1 was printed twice; a served figure twice the engine it
    runs (a yardstick of three slow calls) was printed as a met goal."""
    result = _ratio_result(10.0, {(4, 1): 9.5, (4, 4): 9.0, (1, 4): 8.0})
    result["ratios"] = ratios(result)
    line = ratio_lines(result)[0]
    assert "0.95 at concurrency 1 (also the best)" in line and line.count("at concurrency 1") == 1
    assert not result["ratios"]["implausible"]
    result = _ratio_result(10.0, {(4, 1): 21.0, (4, 4): 22.8, (1, 4): 8.0})
    result["ratios"] = ratios(result)
    assert result["ratios"]["implausible"] == ["grpc served_batch4_c1_vs_raw = 2.1", "grpc served_batch4_best_vs_raw = 2.28"]
    assert any("IMPLAUSIBLE" in line and "proves no goal" in line for line in ratio_lines(result))
    result["instances"] = 4  # four engines serve in parallel: 2.28x one engine is plausible
    assert not ratios(result)["implausible"]


def test_inprocess_yardstick_is_long_enough():
    """Regression: an in-process cell of three calls decided a ratio; now >= 10 calls and >= 3 s."""
    from hf2triton.perf.bench import RAW_MIN_CALLS, RAW_MIN_SECONDS, raw_throughput

    class Engine:
        calls = 0

        def run(self, texts, **_):
            Engine.calls += 1
            return {}

    out = raw_throughput(Engine(), ["a"] * 8, 4, 0.01, {})
    assert out["calls"] >= RAW_MIN_CALLS and RAW_MIN_SECONDS >= 3


def test_overlay_overrides_merge_by_model_name(tmp_path):
    config = tmp_path / "config.yaml"
    entry = "  - {name: %s, source: org/%s, task: feature-extraction}\n"
    config.write_text("models:\n" + entry % ("a", "a") + entry % ("b", "b"))
    cfg = load_config(config, {"overrides": {"b": {"instances": 3, "dynamic_batching": {"max_queue_delay_us": 7}}}})
    assert cfg["models"][1]["instances"] == 3 and cfg["models"][1]["dynamic_batching"]["max_queue_delay_us"] == 7
    assert cfg["models"][0]["instances"] == 1, "other models untouched"
    for overrides, message in [
        ({"zzz": {"instances": 2}}, "config.overrides.zzz: no model named"),
        ({"a": {"name": "c"}}, "cannot be renamed"),
        ({"a": 5}, "not a mapping"),
        ({"a": {"instances": 0}}, r"config.models\[0\].instances"),
    ]:
        with pytest.raises(UserError, match=message):
            load_config(config, {"overrides": overrides})


def test_bench_and_tune_config_checked(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("models:\n  - {name: a, source: org/a, task: feature-extraction}\n")
    cfg = load_config(config)
    assert cfg["bench"]["concurrency"] == [1, 4, 16] and cfg["tune"]["latency_budget_ms"] == 1000
    for overrides, message in [
        ({"bench": {"concurrency": [0]}}, r"config.bench.concurrency\[0\]"),
        ({"bench": {"protocols": ["udp"]}}, "one of http, grpc"),
        ({"bench": {"seconds": 100000}}, "config.bench.seconds"),
        ({"tune": {"models": ["nope"]}}, "config.tune.models: no model named 'nope'"),
        ({"tune": {"max_batch_size": [2048]}}, "config.tune.max_batch_size: 2048 is out of range"),
        ({"tune": {"backends": ["vllm"]}}, r"config.tune.backends\[0\]"),
    ]:
        with pytest.raises(UserError, match=message):
            load_config(config, overrides)


# ---------------------------------------------------------------- perf_analyzer sends the client key, off its command line


@pytest.mark.parametrize(("protocol", "header"), [("http", "hf2triton-key"), ("grpc", "triton-grpc-protocol-hf2triton-key")])
def test_perf_analyzer_gets_the_key_through_the_environment_not_argv(tmp_path, monkeypatch, protocol, header):
    """perf_analyzer needs glibc >= 2.38 (not on every machine): its argv and environment are checked here, and a
    stand-in program shows what the shim gives it (the real arguments) and what /proc shows (placeholders)."""
    from hf2triton.triton import client
    from hf2triton.triton.hidden_args import PLACEHOLDER_PREFIX

    key = client.client_key()
    seen, real_run = {}, subprocess.run

    def fake_run(cmd, **kwargs):
        if cmd[0] != "/opt/perf_analyzer":  # the shim's compiler, the stand-in
            return real_run(cmd, **kwargs)
        seen.update(cmd=cmd, env=kwargs["env"])
        csv = cmd[cmd.index("-f") + 1]
        with open(csv, "w") as handle:
            handle.write(PERF_ANALYZER_CSV)
        # the stand-in: a shell under the same shim prints the arguments its main() got and its /proc cmdline
        probe = ["/bin/sh", "-c", 'printf "%s\\n" "$@"; echo ---; tr "\\0" "\\n" < /proc/$$/cmdline', "sh", *cmd[cmd.index("-H") :]]
        seen["probe"] = real_run(probe, env=kwargs["env"], capture_output=True, text=True, check=True).stdout
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(loadgen.subprocess, "run", fake_run)
    monkeypatch.setattr(loadgen, "model_statistics", lambda url, model: {"success_count": 0})
    load = loadgen.Load(protocol, {"http": "127.0.0.1:1", "grpc": "127.0.0.1:2"}, "m", [b"a text"], 1, 1, 0.5, 10)
    cell = loadgen.measure_perf_analyzer(load, "/opt/perf_analyzer")
    assert cell.tool == "perf_analyzer" and cell.items_per_s == 6012.5
    cmd, env = seen["cmd"], seen["env"]
    assert not any(key in arg for arg in cmd), "the key is never on the command line (/proc/<pid>/cmdline is world-readable)"
    assert cmd[cmd.index("-H") + 1] == PLACEHOLDER_PREFIX + loadgen.PERF_ANALYZER_KEY_ENV
    assert env[loadgen.PERF_ANALYZER_KEY_ENV] == f"{header}:{key}", "perf_analyzer's -H takes name:value"
    assert env["LD_PRELOAD"].split(":")[0].endswith(".so")
    given, proc = seen["probe"].split("---\n")
    assert given.splitlines() == ["-H", f"{header}:{key}"], "what the program's main() gets"
    assert key not in proc and PLACEHOLDER_PREFIX in proc, "what other users see in /proc"


# ---------------------------------------------------------------- the gateway bench measures is its own (issue 24 #15)


def test_bench_gateway_is_private_loopback_with_the_users_limits(tmp_path):
    from hf2triton.perf import gateway_cost
    from hf2triton.specs import OpenAISpec
    from hf2triton.triton.settings import Settings

    settings = Settings.of(ServerSpec(host="0.0.0.0", grpc_port=18001), ["a", "b"], str(tmp_path / "w"), str(tmp_path / "r"))  # noqa: S104
    users = OpenAISpec(enabled=True, host="0.0.0.0", port=9000, allowed_hosts=("x.example",), max_embedding_inputs=7)  # noqa: S104
    cmd, address = gateway_cost.private_gateway_command(settings, users, 45678)
    flags = dict(zip(cmd[3::2], cmd[4::2]))
    assert flags["--grpc"] == "127.0.0.1:18001", "in front of the Triton being measured"
    assert (flags["--host"], flags["--port"], address) == ("127.0.0.1", "45678", "127.0.0.1:45678"), "loopback, not openai.port"
    assert flags["--api-key-env"] == gateway_cost.BENCH_KEY_ENV, "its own one-off key, not the users' variable"
    assert flags["--allowed-hosts"] == "x.example" and flags["--max-embedding-inputs"] == "7", "the users' limits: the same gateway"


def test_bench_step_never_starts_stops_or_repoints_the_users_gateway(tmp_path, monkeypatch):
    from hf2triton.gateway import process as gateway_process
    from hf2triton.perf import bench
    from hf2triton.specs import OpenAISpec, to_param

    def touched(*args, **kwargs):
        raise AssertionError("the gateway users talk to was touched")

    for name in ("ensure_gateway", "stop_gateway"):
        monkeypatch.setattr(gateway_process, name, touched)
    monkeypatch.setattr(bench, "ensure_server", lambda settings: {"action": "kept", "reason": "current"})
    passed = {}
    monkeypatch.setattr(bench, "bench_served_model", lambda *args: passed.update(gateway=args[7]))
    common = {"server": to_param(ServerSpec()), "models": ["a"], "work": str(tmp_path / "w"), "repository": str(tmp_path / "r")}
    specs = {"bench": to_param(BenchSpec()), "model": to_param(_model(name="a")), "openai": to_param(OpenAISpec(enabled=True))}
    bench.bench_model_step("a", **common, **specs, output_json="", scratch=str(tmp_path / "s"))
    assert callable(passed["gateway"]), "a factory: the bench's own gateway, opened for the gateway stage only"
