"""server.cuda_mps: when the server gets a private CUDA MPS daemon, and what happens when MPS cannot work.
(The daemon itself needs an NVIDIA GPU: it ran on the H200, benchmarks/h200/README.md.)"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from hf2triton.config import validate_config
from hf2triton.errors import UserError
from hf2triton.specs import ServerSpec
from hf2triton.triton import mps
from hf2triton.triton.modelconfig import build_model_config, config_text
from hf2triton.triton.process import _cuda_mps, gpu_processes
from hf2triton.triton.settings import Settings
from hf2triton.triton.state import Facts, decide
from tests.helpers import fake_mps_control


@pytest.fixture
def fake_control(tmp_path, monkeypatch):
    """An `nvidia-cuda-mps-control` on PATH whose daemon cannot start (as where the GPU or driver refuses)."""
    return fake_mps_control(tmp_path, monkeypatch, "echo 'An MPS control daemon cannot be started here' >&2\nexit 1")


def test_plan_by_mode_and_gpu_processes(tmp_path, fake_control, monkeypatch):
    assert mps.plan("off", 8, tmp_path).wanted is False
    assert mps.plan("auto", 0, tmp_path).reason == "no model runs on a GPU"
    assert mps.plan("auto", 1, tmp_path).wanted is False  # one CUDA context: nothing to share
    wanted = mps.plan("auto", 4, tmp_path)
    assert wanted.wanted and wanted.pipe_dir == str(tmp_path / "mps") and wanted.log_dir == str(tmp_path / "mps-log")
    assert wanted.environment == {"CUDA_MPS_PIPE_DIRECTORY": wanted.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": wanted.log_dir}
    assert mps.plan("on", 1, tmp_path).wanted is True
    with pytest.raises(UserError, match="no model runs on a GPU"):
        mps.plan("on", 0, tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert mps.plan("auto", 4, tmp_path).reason == f"{mps.CONTROL} is not installed"
    with pytest.raises(UserError, match="not on PATH") as err:
        mps.plan("on", 4, tmp_path)
    assert "server.cuda_mps: auto" in err.value.fix


def test_pipe_directory_fits_a_unix_socket(tmp_path):
    deep = tmp_path / ("d" * 120) / "server"
    pipe, log_dir = mps.directories(deep)
    assert len(pipe) + len("/control_privileged") <= mps.SOCKET_PATH_MAX and f"-{os.getuid()}-" in pipe
    assert log_dir == str(deep / "mps-log")
    assert mps.directories(deep) == (pipe, log_dir)  # stable: the same server finds its daemon again


def test_config_reads_bare_on_off_and_names_bad_values():
    base = {"models": [{"name": "m", "source": "org/m", "task": "feature-extraction"}]}
    assert validate_config({**base, "server": {"cuda_mps": True}})["server"]["cuda_mps"] == "on"  # YAML's bare `on`
    assert validate_config({**base, "server": {"cuda_mps": False}})["server"]["cuda_mps"] == "off"
    assert validate_config(base)["server"]["cuda_mps"] == "auto"
    with pytest.raises(UserError, match="cuda_mps"):
        validate_config({**base, "server": {"cuda_mps": "sometimes"}})


def test_gpu_processes_count_gpu_instances_only(tmp_path):
    repository = tmp_path / "repo"
    for name, count, kind in (("enc", 4, "KIND_GPU"), ("gen", 1, "KIND_GPU"), ("cpu", 3, "KIND_CPU")):
        (repository / name).mkdir(parents=True)
        config = build_model_config(name, "feature-extraction", 8, count, kind, 0, {}, embedding_dim=4)
        (repository / name / "config.pbtxt").write_text(config_text(config))
    settings = Settings.of(ServerSpec(), ["enc", "gen", "cpu", "missing"], str(tmp_path / "work"), str(repository))
    assert gpu_processes(settings) == 5


def test_mps_that_cannot_start(tmp_path, fake_control):
    """auto: serve without it (warned); on: a clear error, raised before ensure_server stops anything."""
    settings = Settings.of(ServerSpec(), ["enc"], str(tmp_path / "work"), str(tmp_path / "repo"))
    plan = mps.plan("auto", 4, settings.server_dir)
    _, env, why = _cuda_mps(settings, plan)
    assert env == {} and "-d failed (1): An MPS control daemon cannot be started here" in why
    strict = Settings.of(ServerSpec(cuda_mps="on"), ["enc"], str(tmp_path / "work"), str(tmp_path / "repo"))
    with pytest.raises(UserError, match="server.cuda_mps is on, but") as err:
        _cuda_mps(strict, mps.plan("on", 4, strict.server_dir))
    assert "auto" in err.value.fix
    assert oct(Path(plan.pipe_dir).stat().st_mode & 0o777) == "0o700"  # other users cannot reach the daemon


STATE = {"pid": 1, "boot_id": "b", "cmdline": ["tritonserver"], "digests": {}}
FACTS = Facts("b", True, True, True, {})


def test_turning_mps_on_or_off_restarts_the_server():
    assert decide(STATE, FACTS, STATE["cmdline"], wanted_mps=False).action == "keep"  # a state from before cuda_mps
    assert decide(STATE, FACTS, STATE["cmdline"], wanted_mps=True).reason == "CUDA MPS on (server.cuda_mps)"
    with_mps = {**STATE, "cuda_mps": {"wanted": True, "active": False, "reason": "x"}}
    assert decide(with_mps, FACTS, STATE["cmdline"], wanted_mps=True).action == "keep"  # wanted but unavailable: no restart loop
    assert decide(with_mps, FACTS, STATE["cmdline"], wanted_mps=False).action == "restart"


def test_a_daemon_that_cannot_serve_cuda_is_stopped_again(tmp_path, monkeypatch):
    """The daemon starts, but no CUDA context can be made through it (here: no GPU): start() says why and
    leaves no daemon behind; stop() finds a daemon by its pipe directory alone (no state needed)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / mps.CONTROL
    # -d: a background process named like the daemon (with the caller's environment); "quit" on stdin ends it.
    control.write_text(
        "#!/bin/bash\n"
        'if [ "$1" = "-d" ]; then (exec -a "$0" sleep 300 </dev/null &>/dev/null &); exit 0; fi\n'
        'read -r command; [ "$command" = quit ] && pkill -f "^$0 300"; exit 0\n'
    )
    control.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    plan = mps.plan("auto", 2, tmp_path / "server")
    why = mps.start(plan)
    assert why.startswith("MPS does not work here (") and "control.log" in why
    assert mps.daemon_pids(plan.pipe_dir) == []
    subprocess.run([str(control), "-d"], env={**os.environ, **plan.environment}, check=True)
    deadline = time.monotonic() + 5
    while not mps.daemon_pids(plan.pipe_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mps.daemon_pids(plan.pipe_dir) and mps.daemon_pids(str(tmp_path / "other")) == []
    assert mps.stop(plan) is True and mps.daemon_pids(plan.pipe_dir) == []
    assert mps.stop(plan) is False
