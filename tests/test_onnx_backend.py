"""backend: onnx for all three tasks (fp32 and int8) through the real workflow and server, with the
parity gate against torch, and exact reruns when onnx.quantize changes. Generation streams by default: the
ONNX decoder behind the continuous batcher (streams of different lengths at once, a cancelled one's row freed)."""

from __future__ import annotations

import threading
import time

import pytest

from hf2triton.triton import client
from tests.helpers import long_context_copy, make_workflow, staggered, tiny_model_entries

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def onnx_workflow(tmp_path_factory, tiny_models):
    # the decoder with a 4096-token context, so a long stream lasts seconds; 2 rows run, 2 more may wait
    long_context = long_context_copy(tiny_models["text-generation"], tmp_path_factory.mktemp("long-context"))
    models = tiny_model_entries({**tiny_models, "text-generation": long_context})
    for model in models:
        model["backend"] = "onnx"
    generate = next(model for model in models if model["name"] == "generate")
    generate["generation"] = {"max_sequences": 2, "max_queue": 4, "max_new_tokens_limit": 3000}
    models.append({**models[0], "name": "embed8", "onnx": {"quantize": "dynamic-int8", "parity_floor": 0.9}})
    models.append({**models[1], "name": "classify8", "onnx": {"quantize": "dynamic-int8"}})
    workflow = make_workflow(tmp_path_factory.mktemp("onnx-workflow"), models)
    workflow.first_run = workflow.run("serve")
    yield workflow
    workflow.stop()


def test_all_tasks_served_from_onnx_with_parity_figures(onnx_workflow):
    jobs = onnx_workflow.jobs_run(onnx_workflow.first_run)
    assert jobs.count("export_onnx") == 5
    report = onnx_workflow.report()
    assert report["ok"], report
    for name, model in report["models"].items():
        assert model["backend"] == "onnx"
        parity = model["parity"]
        assert parity["ok"], (name, parity)
        print(name, parity)
    assert report["models"]["embed"]["parity"]["cosine_min"] >= 0.999 and report["models"]["embed"]["parity"]["texts"] >= 32
    assert report["models"]["embed8"]["parity"]["floor"] == 0.9
    for name in ("classify", "classify8"):
        assert report["models"][name]["parity"]["labels_identical"] == report["models"][name]["parity"]["texts"]
    assert report["models"]["generate"]["parity"]["greedy_identical"] == report["models"]["generate"]["parity"]["prompts"]
    assert "parity onnx vs torch" in (onnx_workflow.directory / "results/validation/report.md").read_text()


def test_changing_quantize_reexports_without_refetching(onnx_workflow):
    for model in onnx_workflow.config["models"]:
        if model["name"] == "embed":
            model["onnx"] = {"quantize": "dynamic-int8", "parity_floor": 0.9}
    dry = onnx_workflow.run("-n", "serve")
    assert sorted(onnx_workflow.jobs_run(dry)) == ["export_onnx", "lint", "repository", "serve", "validate"]
    result = onnx_workflow.run("serve")
    assert sorted(onnx_workflow.jobs_run(result)) == ["export_onnx", "lint", "repository", "serve", "validate"]
    assert "server: reload (changed: embed)" in result.stderr
    report = onnx_workflow.report()
    assert report["ok"] and report["models"]["embed"]["parity"]["floor"] == 0.9


def test_failed_validation_leaves_its_report_and_a_pass_removes_it(onnx_workflow):
    """A parity gate the int8 export cannot meet stops `serve` with failed-report.md (not a rule output:
    Snakemake deletes a failed job's outputs); the next passing run removes it, so a stale failure never
    stands next to a passing report."""
    embed8 = next(m for m in onnx_workflow.config["models"] if m["name"] == "embed8")
    failed_report = onnx_workflow.directory / "results" / "validation" / "failed-report.md"
    embed8["onnx"] = {"quantize": "dynamic-int8", "parity_floor": 1.0}
    try:
        result = onnx_workflow.run("serve", check=False)
        assert result.returncode == 1 and "validation failed: embed8: parity onnx vs torch" in result.stderr, result.stderr[-2000:]
        assert "Traceback" not in result.stderr, result.stderr[-4000:]
        assert "see results/validation/failed-report.md" in result.stderr, result.stderr[-4000:]
        assert "**FAIL**" in failed_report.read_text()
        status = onnx_workflow.run("status").stdout
        assert '"validation": "failed: see results/validation/failed-report.md"' in status and '"current": false' in status, status
    finally:
        embed8["onnx"] = {"quantize": "dynamic-int8", "parity_floor": 0.9}
    onnx_workflow.run("serve")
    assert onnx_workflow.report()["ok"] and not failed_report.exists()
    assert '"validation": "passed"' in onnx_workflow.run("status").stdout


def test_onnx_runtime_threads_sleep_and_decoders_spin_only_inside_a_run():
    """Served, spinning pool threads took the cores Triton's frontend needs: ONNX served at ~0.5x its
    in-process speed; with sleeping threads 0.85-0.91x (benchmarks/bench-2cpu/README.md). A decoder step
    (hundreds of small kernels) spins inside a Run only, and stops when the Run ends."""
    from hf2triton.serving.runtimes.onnxruntime import ort_session_options

    options = ort_session_options(2)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)
    decoder = ort_session_options(2, spin_within_runs=True)
    assert decoder.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert decoder.get_session_config_entry("session.force_spinning_stop") == "1"


def test_torch_runs_on_one_thread_beside_onnx_runtime(onnx_workflow):
    """In an ONNX stub torch only pools and converts: one thread, so no idle OpenMP worker spins beside
    ONNX Runtime's pool (measured: benchmarks/bench-2cpu/README.md); a torch engine keeps its share."""
    import subprocess
    import sys

    models = onnx_workflow.work / "models" / "embed8"
    probe = (
        "import sys, torch; from hf2triton.serving.tasks.embedding import EmbeddingEngine; "
        "EmbeddingEngine(sys.argv[1], num_threads=2, **({'backend': 'onnx', 'onnx_dir': sys.argv[2]} if sys.argv[2] else {})); "
        "print(torch.get_num_threads())"
    )
    for onnx_dir, threads in ((str(models / "onnx"), "1"), ("", "2")):
        done = subprocess.run(  # noqa: S603 - this interpreter, fixed code
            [sys.executable, "-c", probe, str(models / "pretrained"), onnx_dir], capture_output=True, text=True, check=True
        )
        assert done.stdout.split()[-1] == threads, (onnx_dir, done.stdout, done.stderr[-500:])


def test_onnx_decoder_loop_answers_like_torch_generate(onnx_workflow):
    """The ONNX decoder's own loop (KV cache kept in ONNX Runtime values) picks the same greedy tokens as
    torch's `generate`, for batches of different prompt lengths (the builder's graph takes them right-padded);
    sampling draws valid tokens."""
    from hf2triton.serving.tasks.generation import GenerationEngine

    models = onnx_workflow.work / "models" / "generate"
    torch_engine = GenerationEngine(str(models / "pretrained"), num_threads=1)
    onnx_engine = GenerationEngine(str(models / "pretrained"), num_threads=1, backend="onnx", onnx_dir=str(models / "onnx"))
    assert onnx_engine.model.right_padded  # exporter auto: the GenAI builder's graph (GroupQueryAttention)
    prompts = ["hello", "a much longer prompt with many more words in it than the first", "x y z"]
    for max_new_tokens in (1, 7, 24):
        expected = torch_engine.run(prompts, max_new_tokens=max_new_tokens)["text_output"].tolist()
        assert onnx_engine.run(prompts, max_new_tokens=max_new_tokens)["text_output"].tolist() == expected
    batch = onnx_engine.tokenizer(prompts, padding=True, add_special_tokens=False, return_tensors="np")
    sampled = onnx_engine.model.generate(batch["input_ids"], batch["attention_mask"], 5, onnx_engine.tokenizer.pad_token_id, 0.9)
    assert sampled.shape[0] == 3 and 1 <= sampled.shape[1] <= 5
    assert ((sampled >= 0) & (sampled < onnx_engine.model.config.vocab_size)).all()


STREAM_PROMPTS = ["What is the capital of France?", "Hi", "Tell me a very long story about a dragon and a knight", "x y z"]


def test_onnx_generation_streams_like_torch_with_rows_joining_and_leaving(onnx_workflow):
    """Streams of different prompt and answer lengths sent at once (2 run, 2 wait for a row): each is the torch
    model's greedy text; validation held the streamed answers to torch too (parity onnx vs torch)."""
    from hf2triton.serving.tasks.generation import GenerationEngine

    model = onnx_workflow.report()["models"]["generate"]
    checks = {c["name"]: c for c in model["checks"]}
    assert model["streaming"] and checks["parity onnx vs torch"]["ok"] and checks["served equals in-process"]["ok"], checks
    assert checks["grpc stream"]["ok"], checks["grpc stream"]
    grpc = onnx_workflow.settings().url("grpc_port")
    lengths = [12, 30, 7, 20]
    torch_engine = GenerationEngine(str(onnx_workflow.work / "models" / "generate" / "pretrained"), num_threads=1)
    want = [torch_engine.run([p], max_new_tokens=n)["text_output"][0].decode() for p, n in zip(STREAM_PROMPTS, lengths)]
    got: dict[int, str] = {}

    def stream(index: int) -> None:
        got[index] = client.stream_generate(grpc, "generate", STREAM_PROMPTS[index], {"max_new_tokens": lengths[index]})["text"]

    staggered(stream, 4, 0.02)
    assert [got[i].strip() for i in range(4)] == want


def test_a_cancelled_onnx_stream_frees_its_row(onnx_workflow):
    """Two long streams fill the running batch; their clients go; a new request is answered at once, not after
    the long answers (which take `alone` seconds each)."""
    import tritonclient.grpc as grpcclient

    grpc = onnx_workflow.settings().url("grpc_port")
    long = {"max_new_tokens": 3000, "temperature": 1.0, "seed": 1}  # sampled: a random model's greedy answer may end at once
    started = time.monotonic()
    assert client.stream_generate(grpc, "generate", STREAM_PROMPTS[2], long)["completion_tokens"] == 3000
    alone = time.monotonic() - started
    running, streams = [threading.Event(), threading.Event()], []
    for event in running:
        triton = client.grpc_client(grpc)
        triton.start_stream(callback=lambda result, error, event=event: event.set())
        triton.async_stream_infer("generate", client.build_inputs(grpcclient, [STREAM_PROMPTS[2]], long, one_prompt=True))
        streams.append(triton)
    assert all(event.wait(timeout=60) for event in running), "both long streams run"
    for triton in streams:
        triton.stop_stream(cancel_requests=True)
        triton.close()
    started = time.monotonic()
    answer = client.stream_generate(grpc, "generate", STREAM_PROMPTS[1], {"max_new_tokens": 4})
    assert answer["completion_tokens"] >= 1 and time.monotonic() - started < alone / 2, (time.monotonic() - started, alone)
