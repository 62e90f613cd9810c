"""Launcher logic without starting a server: locating, environment, command line, state decisions."""

from __future__ import annotations

import os
import stat
import sys
import sysconfig
from pathlib import Path

import pytest

from hf2triton import host
from hf2triton.errors import UserError
from hf2triton.specs import ServerSpec
from hf2triton.triton.hidden_args import placeholder
from hf2triton.triton.pitfalls import explain, relevant_log_lines
from hf2triton.triton.process import (
    Facts,
    Settings,
    decide,
    listen_addresses,
    locate_tritonserver,
    prepare_backend_dir,
    redacted_command,
    restricted_arguments,
    server_command,
    server_environment,
)


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings.of(
        ServerSpec(http_port=18000, grpc_port=18001, metrics_port=18002), ["a", "b"], str(tmp_path / "work"), str(tmp_path / "repo")
    )


def test_locates_wheel_server_with_matching_stub(monkeypatch):
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # no tritonserver on this PATH
    install = locate_tritonserver()
    assert install.origin == "nvidia-pytriton wheel"
    assert os.access(install.binary, os.X_OK)
    assert install.stub.endswith(f"python_backend_stubs/{sys.version_info.major}.{sys.version_info.minor}/triton_python_backend_stub")
    assert Path(install.lib_dirs[0]).name == "nvidia_pytriton.libs"


def test_tritonserver_on_path_wins(tmp_path, monkeypatch):
    fake_root = tmp_path / "opt" / "tritonserver"
    (fake_root / "bin").mkdir(parents=True)
    (fake_root / "backends" / "onnxruntime").mkdir(parents=True)
    binary = fake_root / "bin" / "tritonserver"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake_root / 'bin'}{os.pathsep}{os.environ['PATH']}")
    install = locate_tritonserver()
    assert install.origin == "PATH" and install.binary == str(binary)
    assert install.backends == str(fake_root / "backends") and install.stub is None


def test_backend_dir_has_stub_for_running_python(tmp_path):
    backend_dir = Path(prepare_backend_dir(locate_tritonserver(), tmp_path))
    python = backend_dir / "python"
    assert sorted(p.name for p in python.iterdir()) == [
        "libtriton_python.so",
        "triton_python_backend_stub",
        "triton_python_backend_utils.py",
    ]
    assert os.access(python / "triton_python_backend_stub", os.X_OK)


def test_environment_puts_wheel_libs_and_libdir_first(monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/lib/other")
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    monkeypatch.setenv("HF_TOKEN", "hf_secretsecretsecretsecret")
    install = locate_tritonserver()
    env = server_environment(install)
    parts = env["LD_LIBRARY_PATH"].split(":")
    assert parts[0] == install.lib_dirs[0]
    assert parts[1] == sysconfig.get_config_var("LIBDIR")
    assert parts[-1] == "/usr/lib/other"
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert "PYTHONPATH" not in env and "HF_TOKEN" not in env


def test_command_binds_loopback_explicit_models_and_restricts_apis(settings):
    install = locate_tritonserver()
    cmd = server_command(install, settings, "/b", "s3cret")
    assert f"--model-repository={settings.repository}" in cmd
    assert "--model-control-mode=explicit" in cmd and "--load-model=a" in cmd and "--load-model=b" in cmd
    for flag in (
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        "--http-port=18000",
        "--grpc-port=18001",
        "--metrics-port=18002",
    ):
        assert flag in cmd
    hidden = restricted_arguments("s3cret")  # the real flags go through the environment; the command holds placeholders
    assert [placeholder(n) for n in hidden] == [a for a in cmd if a.startswith("@hf2triton-env:")]
    assert hidden["HF2TRITON_ARG_HTTP_RESTRICTED_API"].startswith("--http-restricted-api=model-repository")
    assert hidden["HF2TRITON_ARG_GRPC_RESTRICTED_PROTOCOL"].startswith("--grpc-restricted-protocol=model-repository")
    assert "s3cret" not in " ".join(cmd) and "s3cret" not in " ".join(redacted_command(cmd))


@pytest.mark.parametrize(
    "address,http,grpc",
    [("127.0.0.1", "127.0.0.1", "127.0.0.1"), ("::1", "ipv6:::1", "[::1]"), ("[::]", "ipv6:::", "[::]"), ("0.0.0.0", "0.0.0.0", "0.0.0.0")],
)
def test_listen_addresses_in_the_forms_tritonserver_reads(address, http, grpc):
    assert listen_addresses(address) == {"http": http, "grpc": grpc}


def facts(**overrides) -> Facts:
    base = {"boot_id": "boot-1", "pid_alive": True, "cmdline_matches": True, "ready": True, "digests": {"a": "d1", "b": "d2"}}
    base.update(overrides)
    return Facts(**base)


STATE = {"pid": 123, "boot_id": "boot-1", "cmdline": ["tritonserver", "--x"], "digests": {"a": "d1", "b": "d2"}}


@pytest.mark.parametrize(
    "state,observed,wanted,expected,models",
    [
        (None, facts(), None, "start", ()),
        (STATE, facts(boot_id="boot-2", pid_alive=False, cmdline_matches=False, ready=False), None, "start", ()),
        (STATE, facts(pid_alive=False, cmdline_matches=False, ready=False), None, "start", ()),
        (STATE, facts(cmdline_matches=False, ready=False), None, "start", ()),
        (STATE, facts(), ["tritonserver", "--y"], "restart", ()),
        (STATE, facts(ready=False), STATE["cmdline"], "restart", ()),
        (STATE, facts(digests={"a": "d1", "b": "new"}), STATE["cmdline"], "reload", ("b",)),
        (STATE, facts(dead_stubs=["a"]), STATE["cmdline"], "reload", ("a",)),
        (STATE, facts(digests={"a": "new", "b": "d2"}, dead_stubs=["a", "b"]), STATE["cmdline"], "reload", ("a", "b")),
        (STATE, facts(), STATE["cmdline"], "keep", ()),
        (STATE, facts(ready=False, live=True, not_ready=["b"]), STATE["cmdline"], "reload", ("b",)),
        (STATE, facts(ready=False, live=False, not_ready=[]), STATE["cmdline"], "restart", ()),
    ],
    ids=[
        "no-state",
        "other-boot",
        "dead",
        "pid-reused",
        "settings-changed",
        "not-ready",
        "model-changed",
        "stub-died",
        "both",
        "current",
        "one-model-down",
        "not-live",
    ],  # fmt: skip
)
def test_decide(state, observed, wanted, expected, models):
    decision = decide(state, observed, wanted)
    assert decision.action == expected and decision.reason and decision.models == models


def test_port_check(settings):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not host.port_is_free("127.0.0.1", port)
        from hf2triton.triton.process import _check_ports

        busy = Settings.of(
            ServerSpec(http_port=port, grpc_port=host.free_port(), metrics_port=host.free_port()), ["a"], settings.work, settings.repository
        )
        with pytest.raises(UserError) as info:
            _check_ports(busy)
        assert f"port {port} (server.http_port)" in info.value.render() and "config.yaml" in info.value.render()


@pytest.mark.parametrize(
    "line,cause",
    [
        (
            "E1130 model_lifecycle.cc:638] failed to load 'x' version 1: Invalid argument: "
            "instance group x of model x has kind KIND_GPU but no GPUs are available",
            "KIND_GPU",
        ),
        ("unable to find backend library for backend 'onnxruntime', try specifying runtime on the model configuration.", "backend"),
        ("failed to start GRPC service: Unavailable - Socket '0.0.0.0:8001' already in use", "port"),
        ("ImportError: /x/_ssl.so: undefined symbol: _PyModule_Add", "libpython"),
        ("I1130 python_be.cc] Python model file not found in '/r/m/1/model.py'", "model.py"),
        ("Internal: ModuleNotFoundError: No module named 'torch'", "imports a package"),
    ],
)
def test_pitfalls_explain_log_lines(line, cause):
    assert any(cause in p.cause for p in explain(line))


def test_relevant_log_lines_skip_nvml_noise():
    log = "W1130 metrics.cc] Failed to initialize NVML\nE1130 model.cc] failed to load 'm'\nI1130 server.cc] ok\n"
    assert relevant_log_lines(log) == ["E1130 model.cc] failed to load 'm'"]
