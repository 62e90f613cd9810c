"""Launcher logic without starting a server: locating, environment, command line, state decisions."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import pytest

from hf2triton import host
from hf2triton.errors import UserError
from hf2triton.gateway.process import command, exposure, require_api_key, url
from hf2triton.locks import exclusive
from hf2triton.specs import OpenAISpec, ServerSpec, to_param
from hf2triton.triton.hidden_args import placeholder
from hf2triton.triton.install import locate_tritonserver, prepare_backend_dir, server_environment
from hf2triton.triton.pitfalls import explain, relevant_log_lines
from hf2triton.triton.settings import Settings, listen_addresses, redacted_command, restricted_arguments, server_command
from hf2triton.triton.state import Facts, decide


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
    hidden = restricted_arguments("s3cret", "k3y")  # the real flags go through the environment; the command holds placeholders
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
        ({**STATE, "client_key_digest": "k1"}, facts(client_key_digest="k2"), STATE["cmdline"], "restart", ()),
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
        "client-key-changed",
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
        from hf2triton.triton.ports import check_ports_free

        busy = Settings.of(
            ServerSpec(http_port=port, grpc_port=host.free_port(), metrics_port=host.free_port()), ["a"], settings.work, settings.repository
        )
        with pytest.raises(UserError) as info:
            check_ports_free(busy)
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


# ---------------------------------------------------------------- the gateway's boundary (issue 24 #1, #2), the serving lock (#6)


def test_gateway_binds_its_own_host_with_the_boundary_flags(settings):
    plain = dict(zip(*[iter(command(settings, OpenAISpec(enabled=True, port=9100))[3:])] * 2))  # flag -> value
    assert plain == {
        "--grpc": "127.0.0.1:18001",
        "--http": "127.0.0.1:18000",  # openai.upstream's default: generation read from Triton's HTTP stream
        "--host": "127.0.0.1",
        "--port": "9100",
        "--models": "a,b",
        "--api-key-env": "HF2TRITON_API_KEY",
        "--request-timeout-s": "30",
        "--max-audio-upload-mib": "25",
    }, "no empty allowlists, no embedding cap unless configured"
    public = OpenAISpec(
        enabled=True,
        host="0.0.0.0",  # noqa: S104
        port=9100,
        allowed_hosts=("a.example", "b"),
        allowed_origins=("http://x:1", "https://y"),
        max_embedding_inputs=7,
        request_timeout_s=2.5,
        max_audio_upload_mib=40,
        upstream="grpc",
    )
    flags = dict(zip(*[iter(command(settings, public)[3:])] * 2))
    assert "--http" not in flags, "openai.upstream grpc: generation over gRPC like everything else"
    assert flags["--host"] == "0.0.0.0" and flags["--grpc"] == "127.0.0.1:18001", "the gateway public, Triton where server.host says"
    assert flags["--allowed-hosts"] == "a.example,b" and flags["--allowed-origins"] == "http://x:1,https://y"
    assert flags["--max-embedding-inputs"] == "7" and flags["--request-timeout-s"] == "2.5" and flags["--max-audio-upload-mib"] == "40"
    assert url(settings, public) == "127.0.0.1:9100" and url(settings, OpenAISpec(host="::1", port=9100)) == "[::1]:9100"
    on_all = Settings.of(ServerSpec(host="::"), ["a"], settings.work, settings.repository)
    assert url(on_all, OpenAISpec(port=9100)) == "[::1]:9100", "openai.host unset: the gateway binds server.host"


def test_a_gateway_beyond_loopback_needs_an_api_key(monkeypatch):
    monkeypatch.delenv("HF2TRITON_UNIT_KEY", raising=False)
    assert exposure(OpenAISpec(enabled=False, host="0.0.0.0"), "127.0.0.1") == {}  # noqa: S104
    assert exposure(OpenAISpec(enabled=True), "127.0.0.1") == {}
    assert exposure(OpenAISpec(enabled=True, host="127.0.0.1"), "0.0.0.0") == {}, "Triton beyond loopback is guarded by the client key"  # noqa: S104
    assert exposure(OpenAISpec(enabled=True), "0.0.0.0")["field"] == "server.host"  # noqa: S104
    exposed = exposure(OpenAISpec(enabled=True, host="0.0.0.0", api_key_env="HF2TRITON_UNIT_KEY"), "127.0.0.1")  # noqa: S104
    with pytest.raises(UserError) as info:
        require_api_key(exposed)
    message = info.value.render()
    for words in (
        "openai.host = '0.0.0.0'",
        "$HF2TRITON_UNIT_KEY",
        "nothing running was touched",
        "export HF2TRITON_UNIT_KEY=",
        "openai.host: 127.0.0.1",
    ):
        assert words in message, message
    monkeypatch.setenv("HF2TRITON_UNIT_KEY", "set")
    require_api_key(exposed)


def test_validate_serve_and_bench_refuse_it_before_touching_the_server(tmp_path, monkeypatch):
    from hf2triton.perf import bench
    from hf2triton.pipeline import serve, validate

    def touched(*args, **kwargs):
        raise AssertionError("the running server was touched")

    for module in (bench, serve, validate):
        monkeypatch.setattr(module, "ensure_server", touched)
    monkeypatch.delenv("HF2TRITON_UNIT_KEY", raising=False)
    spec = OpenAISpec(enabled=True, host="0.0.0.0", api_key_env="HF2TRITON_UNIT_KEY")  # noqa: S104
    common = {"server": to_param(ServerSpec()), "models": ["a"], "work": str(tmp_path / "w"), "repository": str(tmp_path / "r")}
    calls = {
        "validate": lambda: validate.validate_step(**common, output_json="r.json", output_md="r.md", gateway=exposure(spec, "127.0.0.1")),
        "serve": lambda: serve.serve_step(**common, openai=to_param(spec)),
        "bench": lambda: bench.bench_model_step(
            "a", **common, bench={}, model={}, openai=to_param(spec), output_json="", scratch=str(tmp_path)
        ),
    }
    for name, call in calls.items():
        with pytest.raises(UserError) as info:
            call()
        assert "openai.host = '0.0.0.0'" in info.value.render(), name


def test_serving_lock_is_exclusive_reentrant_bounded_and_dies_with_its_holder(tmp_path):
    path = tmp_path / "server" / "serve.lock"
    refused: list[str] = []

    def other_thread() -> None:
        try:
            with exclusive(path, 0.5, "starting the server"):
                refused.append("got it")
        except UserError as err:
            refused.append(err.render())

    with exclusive(path, 1, "starting the server"), exclusive(path, 1, "starting the server"):  # re-entrant within a thread
        waiter = threading.Thread(target=other_thread)
        waiter.start()
        waiter.join()
    assert f"starting the server: another hf2triton run (pid {os.getpid()}) still holds {path}" in refused[0], refused
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from pathlib import Path; import time; from hf2triton.locks import exclusive\n"
         f"with exclusive(Path({str(path)!r}), 5, 'x'):\n    print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=f"pid {holder.pid}"):
            with exclusive(path, 0.3, "x"):
                pass
    finally:
        holder.kill()  # a crash: the kernel releases its lock
        holder.wait()
    with exclusive(path, 2, "x"):
        pass


def test_two_vllm_engines_load_one_after_the_other(settings):
    """vLLM sizes its KV cache from the memory it sees used while it profiles: two engines starting together on one GPU
    count each other's allocations (the second failed, "No available memory for the cache blocks"), so a server with
    more than one backend vllm model loads its models one at a time; with one, Triton's parallel loading stays."""
    from hf2triton.triton.settings import vllm_models

    install = locate_tritonserver()
    repository = Path(settings.repository)

    def render(name: str, backend: str) -> None:
        (repository / name).mkdir(parents=True, exist_ok=True)
        parameter = f'parameters {{ key: "backend" value {{ string_value: "{backend}" }} }}\n'
        (repository / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{parameter}')

    render("a", "vllm")
    render("b", "python")
    assert vllm_models(settings) == ["a"] and "--model-load-thread-count=1" not in server_command(install, settings, "/b", "k")
    render("b", "vllm")
    assert vllm_models(settings) == ["a", "b"] and "--model-load-thread-count=1" in server_command(install, settings, "/b", "k")


def test_free_ports_come_from_below_the_ephemeral_range():
    """A server's port is chosen below the kernel's range of outgoing source ports (where a client connecting anywhere
    meanwhile could take it before the server binds it: a CI run lost the gateway's port so), and is free."""
    import socket

    low, _ = host.ephemeral_ports()
    ports = host.free_ports(5)
    assert len(set(ports)) == 5 and all(1024 <= port < low for port in ports), ports
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
