"""User mistakes and interruptions through the real workflow: one clear line, no traceback, nothing
built is lost, and an interrupted step never counts as done."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from tests.helpers import make_workflow, minilm_dir

pytestmark = pytest.mark.integration


def snapshot(directory) -> set[str]:
    """Files under `directory`, except Snakemake's own run logs."""
    return {str(p.relative_to(directory)) for p in directory.rglob("*") if ".snakemake" not in p.parts}


def test_bad_config_stops_before_any_work(tmp_path):
    workflow = make_workflow(tmp_path / "w", [{"name": "x", "source": "org/x", "task": "feature-extraction", "max_batch_size": -1}])
    workflow.write_config()
    before = snapshot(workflow.directory)
    result = workflow.run("serve", check=False)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("hf2triton: error")]
    assert lines == ["hf2triton: error: config.models[0].max_batch_size = -1: not allowed -- fix: use a number between 0 and 1024"]
    assert "Traceback" not in result.stderr
    assert snapshot(workflow.directory) == before


def test_missing_local_source_named_before_work(tmp_path):
    workflow = make_workflow(tmp_path / "w", [{"name": "x", "source": str(tmp_path / "nowhere"), "task": "feature-extraction"}])
    result = workflow.run("serve", check=False)
    assert result.returncode == 1 and "config.models[0].source" in result.stderr and "does not exist" in result.stderr
    assert not (workflow.directory / ".hf2triton").exists()


def test_port_held_by_foreign_process_stops_before_fetch(tmp_path):
    workflow = make_workflow(tmp_path / "w", [{"name": "mini", "source": str(minilm_dir()), "task": "feature-extraction"}])
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", workflow.config["server"]["grpc_port"]))
        blocker.listen()
        result = workflow.run("serve", check=False)
    assert result.returncode == 1
    port = workflow.config["server"]["grpc_port"]
    assert f"127.0.0.1:{port} in use by another program" in result.stderr
    assert "server.grpc_port in config.yaml" in result.stderr
    assert not (workflow.directory / ".hf2triton" / "models").exists(), "preflight must run before any fetch"


def test_gpu_device_on_cpu_host_refused_by_preflight(tmp_path):
    workflow = make_workflow(tmp_path / "w", [{"name": "mini", "source": str(minilm_dir()), "task": "feature-extraction", "device": "gpu"}])
    workflow.env["HF2TRITON_ASSUME_NO_GPU"] = "1"
    result = workflow.run("serve", check=False)
    assert result.returncode == 1 and "device: gpu but this host has no GPU" in result.stderr
    assert not (workflow.directory / ".hf2triton" / "models").exists()


def test_killed_during_pretrained_leaves_nothing_done_and_rerun_completes(tmp_path):
    workflow = make_workflow(tmp_path / "w", [{"name": "mini", "source": str(minilm_dir()), "task": "feature-extraction"}])
    process = workflow.popen(".hf2triton/models/mini/pretrained")
    log = workflow.directory / "results" / "logs" / "pretrained" / "mini.log"
    deadline = time.monotonic() + 120
    while not log.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.5)  # inside the step: transformers is loading or saving
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    pretrained = workflow.directory / ".hf2triton" / "models" / "mini" / "pretrained"
    assert not pretrained.exists(), "a killed step must not leave an output that counts as done"
    result = workflow.run("serve")
    assert "removed the locks of an earlier run" in result.stderr
    assert "pretrained" in workflow.jobs_run(result)
    assert (pretrained / "model.safetensors").is_file()
    assert not list(pretrained.parent.glob(".pretrained.*")), "no partial directory left behind"
    assert workflow.report()["ok"]
    workflow.stop()
