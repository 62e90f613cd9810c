"""The real workflow on tiny local models of all three tasks: build, serve, validate, and the
incremental / restorable behaviours (rerun only what changed; restore a server that is gone)."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import time

import pytest

from hf2triton import host
from hf2triton.pipeline import references
from tests.helpers import make_workflow, tiny_model_entries

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_models):
    """This module's own served workflow: its tests change the config and kill processes, so they do not
    share the session's tiny_workflow (other modules keep an untouched server)."""
    workflow = make_workflow(tmp_path_factory.mktemp("workflow"), tiny_model_entries(tiny_models))
    workflow.first_run = workflow.run("serve")
    workflow.original_config = copy.deepcopy(workflow.config)
    yield workflow
    workflow.stop()


@pytest.fixture
def tiny_workflow(served, request):
    """Every test starts from the original config, served and current, whatever ran before it (any order,
    any subset); config changes a test makes are undone afterwards. A test marked serves_its_own_config gets the
    original config unserved: its own first serve converges the server in one step. (The order below spares
    restores: the tests that change models come last.)"""
    served.config = copy.deepcopy(served.original_config)
    if request.node.get_closest_marker("serves_its_own_config") is None:
        served.run("serve")
    yield served
    served.config = copy.deepcopy(served.original_config)


def test_first_run_builds_everything_and_validates(tiny_workflow):
    jobs = tiny_workflow.jobs_run(tiny_workflow.first_run)  # the module fixture's first run
    assert sorted(jobs) == sorted(
        ["preflight", "validate", "serve"] + [r for r in ("fetch", "pretrained", "repository", "lint") for _ in range(3)]
    )
    report = tiny_workflow.report()
    assert report["ok"] is True
    assert report["server"]["live"] and report["server"]["ready"]
    assert set(report["models"]) == {"embed", "classify", "generate"}
    for name, model in report["models"].items():
        names = {c["name"] for c in model["checks"]}
        # a streaming model (generate, by default) is checked over its stream and /generate instead of /infer
        transport = {"grpc stream", "stream equals generate"} if name == "generate" else {"http equals grpc"}
        assert {"ready", "served config equals rendered", *transport, "served equals in-process", "metrics count requests"} <= names, name
        assert all(c["ok"] for c in model["checks"]), model["checks"]
    markdown = (tiny_workflow.directory / "results" / "validation" / "report.md").read_text()
    assert markdown.count("| ok |") >= 15
    assert f"Host: {host.describe_torch(report['torch'])}" in markdown and report["torch"]["version"].startswith("2.13.0")


def test_rendered_repository_and_state_file_permissions(tiny_workflow):
    repo = tiny_workflow.directory / "model_repository"
    assert sorted(p.name for p in repo.iterdir()) == ["classify", "embed", "generate"]
    for name in ("classify", "embed", "generate"):
        assert (repo / name / "config.pbtxt").is_file() and (repo / name / "1" / "model.py").is_file()
    state_file = tiny_workflow.directory / ".hf2triton" / "server" / "state.json"
    assert oct(state_file.stat().st_mode & 0o777) == "0o600"
    log_file = tiny_workflow.directory / ".hf2triton" / "server" / "tritonserver.log"
    assert not log_file.stat().st_mode & 0o002


def test_noop_rerun_runs_nothing_and_keeps_server(tiny_workflow):
    pid = tiny_workflow.state()["pid"]
    dry = tiny_workflow.run("-n", "serve")
    assert set(tiny_workflow.jobs_run(dry)) == {"serve"}
    started = time.monotonic()
    result = tiny_workflow.run("serve")
    elapsed = time.monotonic() - started
    assert tiny_workflow.jobs_run(result) == ["serve"]
    assert tiny_workflow.state()["pid"] == pid
    assert "server: keep" in result.stderr
    print(f"no-op rerun took {elapsed:.1f} s")


def test_server_killed_is_restored_without_rebuilding(tiny_workflow):
    state = tiny_workflow.state()
    os.killpg(state["pid"], signal.SIGKILL)
    time.sleep(1)
    result = tiny_workflow.run("serve")
    assert tiny_workflow.jobs_run(result) == ["serve"]
    assert "is gone" in result.stderr
    new = tiny_workflow.state()
    assert new["pid"] != state["pid"]
    assert host.process_cmdline(new["pid"]) == new["cmdline"]


def test_a_wiped_saved_model_and_rendered_directory_are_rebuilt_exactly(tiny_workflow):
    """A session that lost one model's saved copy (paths.work) and its rendered directory, the rest kept (the report
    still current): serve plans exactly their rebuild -- it planned nothing, and the server then failed on a
    config.pbtxt pointing at a missing model_dir -- and serves the model again."""
    shutil.rmtree(tiny_workflow.work / "models" / "classify" / "pretrained")
    shutil.rmtree(tiny_workflow.directory / "model_repository" / "classify")
    dry = tiny_workflow.run("-n", "serve")
    assert sorted(tiny_workflow.jobs_run(dry)) == ["lint", "pretrained", "repository", "serve", "validate"], dry.stdout[-3000:]
    result = tiny_workflow.run("serve")
    assert sorted(tiny_workflow.jobs_run(result)) == ["lint", "pretrained", "repository", "serve", "validate"]
    assert tiny_workflow.report()["ok"] and (tiny_workflow.directory / "model_repository" / "classify" / "config.pbtxt").is_file()


def test_killed_stub_process_is_detected_and_reloaded(tiny_workflow):
    """A dead Python-backend stub leaves the model 'ready' while every request fails: serve must notice."""
    settings = tiny_workflow.settings()
    state = tiny_workflow.state()
    stubs = [p for p in host.descendants(state["pid"]) if "/model_repository/classify/" in " ".join(host.process_cmdline(p) or [])]
    assert stubs
    os.kill(stubs[0], signal.SIGKILL)
    time.sleep(1)
    result = tiny_workflow.run("serve")
    assert tiny_workflow.jobs_run(result) == ["serve"]
    assert "stub process died: classify" in result.stderr
    assert tiny_workflow.state()["pid"] == state["pid"]
    import numpy as np
    import tritonclient.http as httpclient

    from hf2triton.triton.client import http_client

    client = http_client(settings.url())
    text = httpclient.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"works again"]], dtype=np.object_))
    assert client.infer("classify", [text]).as_numpy("label").shape == (1, 1)


def test_other_boot_id_restarts_server(tiny_workflow):
    """A wiped/restored session: the state file comes from another boot -> start a new server."""
    state_file = tiny_workflow.directory / ".hf2triton" / "server" / "state.json"
    state = json.loads(state_file.read_text())
    # Stop the real process first (a reboot would have), then pretend the state is from another boot.
    tiny_workflow.stop()
    state["boot_id"] = "00000000-0000-0000-0000-000000000000"
    state_file.write_text(json.dumps(state))
    result = tiny_workflow.run("serve")
    assert tiny_workflow.jobs_run(result) == ["serve"]
    assert "rebooted" in result.stderr
    assert tiny_workflow.state()["boot_id"] == host.boot_id()


def test_status_and_stop_targets(tiny_workflow):
    status = tiny_workflow.run("status")
    payload = json.loads(status.stdout[status.stdout.index("{") : status.stdout.rindex("}") + 1])
    assert payload["running"] and payload["ready"] and payload["current"]
    assert all(payload["models"].values())
    assert set(payload["torch"]) >= {"version", "cuda_build", "driver", "cuda_works"}, "torch's build, the driver, CUDA"
    pid = tiny_workflow.state()["pid"]
    tiny_workflow.run("stop")
    assert host.process_gone(pid)
    assert not (tiny_workflow.directory / ".hf2triton" / "server" / "state.json").exists()
    # and `serve` brings it back, rebuilding nothing
    assert tiny_workflow.jobs_run(tiny_workflow.run("serve")) == ["serve"]


def test_changing_max_batch_size_rebuilds_only_that_model(tiny_workflow):
    pid = tiny_workflow.state()["pid"]
    for model in tiny_workflow.config["models"]:
        if model["name"] == "embed":
            model["max_batch_size"] = 8
    # (snakemake 9.27's --list-changes params lists every output, changed or not; the dry run's reasons are exact)
    dry = tiny_workflow.run("-n", "serve")
    # preflight too: the GPU memory budget depends on max_batch_size (it is cheap and rebuilds nothing)
    assert sorted(tiny_workflow.jobs_run(dry)) == ["lint", "preflight", "repository", "serve", "validate"]
    assert "model_repository/embed" in dry.stderr + dry.stdout
    reason = next(line for line in dry.stdout.splitlines() if "Params have changed since last execution" in line)
    before, now = reason.split(" before: ")[1].split(" now: ")
    assert "'max_batch_size': 4" in before and "'max_batch_size': 8" in now and "'name': 'embed'" in now
    result = tiny_workflow.run("serve")
    jobs = tiny_workflow.jobs_run(result)
    assert sorted(jobs) == ["lint", "preflight", "repository", "serve", "validate"]
    assert "fetch" not in jobs and "pretrained" not in jobs
    assert "max_batch_size: 8" in (tiny_workflow.directory / "model_repository" / "embed" / "config.pbtxt").read_text()
    assert tiny_workflow.state()["pid"] == pid, "only the changed model is reloaded; the server keeps running"
    assert "server: reload (changed: embed)" in result.stderr
    assert tiny_workflow.report()["ok"]
    if references.cache_root() is None:  # HF2TRITON_CACHE=off: every in-process answer computed again
        return
    # validation again, but the unchanged classifier's in-process answer is the one the first run computed
    assert re.search(r"in-process reference \(in_process_outputs\) of \S+/classify/pretrained: remembered", result.stderr)
    classify = {c["name"]: c["detail"] for c in tiny_workflow.report()["models"]["classify"]["checks"]}
    assert "in-process answer remembered from an earlier run" in classify["served equals in-process"]
    assert tiny_workflow.report()["models"]["embed"]["checks"][1]["name"] == "served config equals rendered"


def test_adding_a_model_then_changing_its_source_rebuilds_only_that_model(tiny_workflow, tiny_models):
    extra = {"name": "embed2", "source": str(tiny_models["feature-extraction"]), "task": "feature-extraction", "max_batch_size": 2}
    tiny_workflow.config["models"].append(extra)
    result = tiny_workflow.run("serve")
    jobs = tiny_workflow.jobs_run(result)
    assert sorted(jobs) == sorted(["fetch", "pretrained", "repository", "lint", "preflight", "validate", "serve"])
    assert tiny_workflow.report()["models"]["embed2"]["ok"]

    extra.update(source=str(tiny_models["text-classification"]), task="text-classification")
    result = tiny_workflow.run("serve")
    jobs = tiny_workflow.jobs_run(result)
    assert sorted(jobs) == sorted(["fetch", "pretrained", "repository", "lint", "preflight", "validate", "serve"])
    assert tiny_workflow.report()["models"]["embed2"]["task"] == "text-classification"

    # a file of a local source overwritten in place (the directory's mtime stays): that model is fetched again
    copy = shutil.copytree(tiny_models["text-classification"], tiny_workflow.directory / "local-classify")
    extra.update(source=str(copy))
    tiny_workflow.run("serve")
    (copy / "config.json").write_text((copy / "config.json").read_text().replace('"positive"', '"good"'))
    dry = tiny_workflow.run("-n", "serve")
    assert "fetch" in tiny_workflow.jobs_run(dry) and "local-classify/config.json" in dry.stdout, dry.stdout[-2000:]


@pytest.mark.serves_its_own_config
def test_removing_a_model_removes_only_its_rendered_directory(tiny_workflow):
    """Regression: a model taken out of config.yaml left its rendered directory behind (lint saw it as a model)."""
    repository = tiny_workflow.directory / "model_repository"
    handmade = repository / "handmade"
    (handmade / "1").mkdir(parents=True)
    (handmade / "config.pbtxt").write_text('name: "handmade"\nbackend: "python"\n')
    tiny_workflow.config["models"] = [m for m in tiny_workflow.config["models"] if m["name"] != "classify"]
    tiny_workflow.run("serve")
    assert sorted(p.name for p in repository.iterdir() if p.is_dir()) == ["embed", "generate", "handmade"]
    assert sorted(tiny_workflow.report()["models"]) == ["embed", "generate"]
    shutil.rmtree(handmade)
