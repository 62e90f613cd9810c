"""The local-user boundary: another user on the same machine can neither obtain the server's admin key (not on
/proc/<pid>/cmdline, not in the stubs' environment) nor read requests and responses (the Python backend's
/dev/shm regions are 0600). The server-side tests act as user `nobody` through setpriv/runuser."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hf2triton import host
from hf2triton.errors import UserError
from hf2triton.pipeline.render import render_model
from hf2triton.specs import ModelSpec, ServerSpec, serving_values
from hf2triton.triton import client, hidden_args
from hf2triton.triton.hidden_args import build_shim, hide_arguments, placeholder
from hf2triton.triton.install import locate_tritonserver
from hf2triton.triton.process import ensure_server, reload_models, stop_server
from hf2triton.triton.settings import RESTRICTED_KEY_HEADER, Settings, redacted_command, restricted_arguments, server_command
from hf2triton.triton.state import Facts, decide, read_state
from tests.helpers import server_block

needs_cc = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler")

PROBE = """
import json, os, subprocess, sys
child = subprocess.run([sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"], capture_output=True, text=True)
print(json.dumps({
    "argv": sys.argv[1:],
    "cmdline": open("/proc/self/cmdline", "rb").read().decode().split("\\0")[:-1],
    "environ": dict(os.environ),
    "child_environ": json.loads(child.stdout),
}))
"""


# ---------------------------------------------------------------- the shim, without a server


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> str:
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler")
    return build_shim(tmp_path_factory.mktemp("shim") / "server")


def run_with_shim(shim: str, arguments: dict[str, str], extra: list[str], ld_preload: str | None = None) -> subprocess.CompletedProcess:
    placeholders, env = hide_arguments(arguments, shim, ld_preload)
    # the real binary, not a wrapper script: a script that exec()s would put the real arguments on the next cmdline
    python = os.path.realpath(sys.executable)
    return subprocess.run(
        [python, "-c", PROBE, *placeholders, *extra], env={**os.environ, **env}, capture_output=True, text=True, timeout=60, check=False
    )


def test_shim_gives_main_the_real_arguments_and_proc_the_placeholders(shim):
    secret = "--http-restricted-api=logging:hf2triton-admin=s3cret-Value"
    result = run_with_shim(shim, {"HF2TRITON_TEST_SECRET": secret}, ["plain"])
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["argv"] == [secret, "plain"]  # what main() (here: Python) sees
    assert seen["cmdline"][-2:] == [placeholder("HF2TRITON_TEST_SECRET"), "plain"]  # what every user sees in /proc
    assert "s3cret-Value" not in " ".join(seen["cmdline"])
    for env in (seen["environ"], seen["child_environ"]):  # neither the program nor its children keep the secret or the shim
        assert "HF2TRITON_TEST_SECRET" not in env and "LD_PRELOAD" not in env and hidden_args.KEEP_LD_PRELOAD not in env
        assert "s3cret-Value" not in json.dumps(env)


def test_shim_keeps_the_users_own_ld_preload(shim, tmp_path):
    own = str(tmp_path / "own.so")  # stands in for the user's own preload (e.g. tcmalloc)
    (tmp_path / "own.c").write_text("int hf2triton_own_preload;\n")
    subprocess.run([shutil.which("cc") or "gcc", "-shared", "-fPIC", "-o", own, str(tmp_path / "own.c")], check=True)
    result = run_with_shim(shim, {"HF2TRITON_TEST_SECRET": "x"}, [], ld_preload=own)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["environ"]["LD_PRELOAD"] == own and seen["child_environ"]["LD_PRELOAD"] == own


def test_shim_refuses_to_run_with_a_placeholder_left(shim):
    _, env = hide_arguments({}, shim)
    python = os.path.realpath(sys.executable)
    result = subprocess.run(
        [python, "-c", "print('main ran')", placeholder("HF2TRITON_NOT_SET")],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2 and "main ran" not in result.stdout
    assert "HF2TRITON_NOT_SET" in result.stderr and "refusing to start" in result.stderr


def test_shim_makes_fchmod_honour_the_umask(shim, tmp_path):
    """boost.interprocess fchmods each shared-memory region to 0644 after creating it; with the shim the
    umask (077 for our server) still applies."""
    target = tmp_path / "region"
    code = f"import os; fd = os.open({str(target)!r}, os.O_CREAT | os.O_RDWR, 0o600); os.fchmod(fd, 0o644)"
    _, env = hide_arguments({}, shim)
    python = os.path.realpath(sys.executable)
    for preload, expected in (({}, 0o644), (env, 0o600)):
        target.unlink(missing_ok=True)
        subprocess.run([python, "-c", code], env={**os.environ, **preload}, umask=0o077, check=True, timeout=60)
        assert stat.S_IMODE(target.stat().st_mode) == expected


@needs_cc
def test_shim_built_once_per_source_in_a_private_directory(tmp_path, monkeypatch):
    directory = tmp_path / "server"
    first = build_shim(directory)
    assert build_shim(directory) == first and stat.S_IMODE(directory.stat().st_mode) == 0o700
    changed = tmp_path / "argv_from_env.c"
    changed.write_text(hidden_args.SHIM_SOURCE.read_text() + "\n/* changed */\n")
    monkeypatch.setattr(hidden_args, "SHIM_SOURCE", changed)
    second = build_shim(directory)
    assert second != first and Path(second).is_file() and not Path(first).exists()
    assert sorted(p.name for p in directory.iterdir()) == [Path(second).name]  # no temporary file left


def test_no_compiler_is_a_user_error_not_a_key_on_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setattr(hidden_args.shutil, "which", lambda name: None)
    with pytest.raises(UserError) as info:
        build_shim(tmp_path / "server")
    assert "C compiler" in info.value.message and "install gcc" in info.value.fix


def test_unpreloadable_shim_path_is_refused():
    with pytest.raises(UserError, match="space or a colon"):
        hide_arguments({"A": "b"}, "/tmp/with space/shim.so")


# ---------------------------------------------------------------- the command line and the restart decision


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings.of(
        ServerSpec(http_port=18000, grpc_port=18001, metrics_port=18002), ["a"], str(tmp_path / "work"), str(tmp_path / "repo")
    )


def test_command_carries_placeholders_and_no_key(settings):
    cmd = server_command(locate_tritonserver(), settings, "/b", "s3cret")
    assert "s3cret" not in " ".join(cmd)
    hidden = restricted_arguments("s3cret", "k3y")
    assert [placeholder(name) for name in hidden] == [a for a in cmd if a.startswith(hidden_args.PLACEHOLDER_PREFIX)]
    assert sorted(v.split("=", 1)[0] for v in hidden.values()) == ["--grpc-restricted-protocol"] * 2 + ["--http-restricted-api"] * 2
    keys = sorted([f"{client.KEY_HEADER}=k3y", f"{RESTRICTED_KEY_HEADER}=s3cret"] * 2)  # the client key and the admin key
    assert sorted(v.rsplit(":", 1)[1] for v in hidden.values()) == keys
    assert redacted_command(cmd) == cmd  # nothing to hide any more


def test_server_started_with_the_key_on_its_command_line_is_restarted(settings):
    """A server of an older hf2triton (key on the command line) counts as changed settings: the next
    `serve` replaces it."""
    wanted = server_command(locate_tritonserver(), settings, "/b", "k")
    legacy = [a for a in wanted if not a.startswith(hidden_args.PLACEHOLDER_PREFIX)]
    legacy += [
        f"--http-restricted-api=logging:{RESTRICTED_KEY_HEADER}=OLDKEY",
        f"--grpc-restricted-protocol=logging:{RESTRICTED_KEY_HEADER}=OLDKEY",
    ]
    assert "OLDKEY" not in " ".join(redacted_command(legacy))
    state = {"pid": 1, "boot_id": "b", "cmdline": legacy, "digests": {"a": "d"}}
    observed = Facts(boot_id="b", pid_alive=True, cmdline_matches=True, ready=True, digests={"a": "d"})
    assert decide(state, observed, wanted).action == "restart"
    assert decide({**state, "cmdline": wanted}, observed, wanted).action == "keep"


# ---------------------------------------------------------------- a real server, seen by user nobody


def as_nobody(*command: str) -> subprocess.CompletedProcess:
    if shutil.which("setpriv"):
        prefix = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    else:
        prefix = ["runuser", "-u", "nobody", "--"]
    return subprocess.run([*prefix, *command], capture_output=True, timeout=60, check=False)


def curl_status(*args: str) -> int:
    result = as_nobody("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", *args)
    return int(result.stdout or 0)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_models):
    if os.geteuid() != 0 or not (shutil.which("setpriv") or shutil.which("runuser")) or not shutil.which("curl"):
        pytest.skip("needs root, setpriv or runuser, and curl (to act as user nobody)")
    root = tmp_path_factory.mktemp("local-users")
    source = tiny_models["feature-extraction"]
    model = ModelSpec(name="embed", source=str(source), task="feature-extraction", max_batch_size=4)
    render_model(str(root / "repo" / "embed"), serving_values(model, False, 2), str(source))
    ports = {k: v for k, v in server_block().items() if k != "startup_timeout_s"}
    settings = Settings.of(ServerSpec(**ports, startup_timeout_s=240), ["embed"], str(root / "work"), str(root / "repo"))
    first = ensure_server(settings)
    try:
        second = ensure_server(settings)
        yield settings, read_state(settings), first, second
    finally:
        stop_server(settings)


def stub_regions(pid: int) -> list[Path]:
    """The /dev/shm regions of the server's Python-backend stubs (the third argument of each stub)."""
    cmdlines = [host.process_cmdline(child) or [] for child in host.descendants(pid)]
    return [Path("/dev/shm") / cmd[2] for cmd in cmdlines if len(cmd) > 2 and cmd[0].endswith("triton_python_backend_stub")]


@pytest.mark.integration
def test_restart_decision_still_works_with_placeholders(served):
    _, state, first, second = served
    assert first["action"] == "start" and second["action"] == "keep", second
    assert second["pid"] == first["pid"] == state["pid"]


@pytest.mark.integration
def test_nobody_sees_no_key_on_the_command_line(served):
    _, state, _, _ = served
    result = as_nobody("cat", f"/proc/{state['pid']}/cmdline")
    assert result.returncode == 0, result.stderr
    cmdline = result.stdout.decode().split("\0")[:-1]
    assert cmdline == state["cmdline"]  # what observe() compares: the state file keeps the command as /proc shows it
    assert state["admin_key"] not in result.stdout.decode()
    assert f"{RESTRICTED_KEY_HEADER}=" not in result.stdout.decode()
    assert [a for a in cmdline if a.startswith(hidden_args.PLACEHOLDER_PREFIX)] == [placeholder(n) for n in restricted_arguments("", "")]
    for private in (f"/proc/{state['pid']}/environ", str(Path(state["log"]).parent / "state.json"), state["log"]):
        assert as_nobody("cat", private).returncode != 0, private


@pytest.mark.integration
def test_nobody_cannot_use_the_restricted_apis(served):
    settings, state, _, _ = served
    cmdline = as_nobody("cat", f"/proc/{state['pid']}/cmdline").stdout.decode()
    found = re.findall(rf"{RESTRICTED_KEY_HEADER}=([^\0,]+)", cmdline)
    assert found == []
    base = f"http://{settings.url()}/v2"
    for value in [None, "wrong", *found, *(a for a in cmdline.split("\0") if a.startswith(hidden_args.PLACEHOLDER_PREFIX))]:
        header = [] if value is None else ["-H", f"{RESTRICTED_KEY_HEADER}: {value}"]
        assert curl_status(*header, "-X", "POST", "-d", "{}", f"{base}/repository/index") == 403, value
        assert curl_status(*header, f"{base}/logging") == 403, value
        assert curl_status(*header, "-X", "POST", "-d", "{}", f"{base}/repository/models/embed/unload") == 403, value
    assert curl_status(f"{base}/health/ready") == 200  # nobody can still use what is meant for every local client
    # control: only the key makes the difference (whoever had it could unload models)
    assert curl_status("-H", f"{RESTRICTED_KEY_HEADER}: {state['admin_key']}", f"{base}/logging") == 200


@pytest.mark.integration
def test_nobody_can_neither_read_the_client_key_nor_infer_without_it(served):
    """The per-user client key (issue 32): inference and metadata need it; another user cannot read it."""
    settings, _, _, _ = served
    key = client.client_key()
    assert stat.S_IMODE(client.key_file().stat().st_mode) == 0o600
    denied = as_nobody("cat", str(client.key_file()))
    assert denied.returncode != 0 and key.encode() not in denied.stdout
    base, body = f"http://{settings.url()}/v2", '{"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["x"]}]}'
    for value in (None, "wrong"):
        header = [] if value is None else ["-H", f"{client.KEY_HEADER}: {value}"]
        assert curl_status(*header, "-X", "POST", "-d", body, f"{base}/models/embed/infer") == 403, value
        assert curl_status(*header, f"{base}/models/embed") == 403, value
    assert curl_status(f"{base}/models/embed/ready") == 200, "health stays open"
    assert curl_status("-H", f"{client.KEY_HEADER}: {key}", "-X", "POST", "-d", body, f"{base}/models/embed/infer") == 200


@pytest.mark.integration
def test_the_key_in_the_state_file_still_opens_them(served):
    settings, state, _, _ = served
    base = f"http://{settings.url()}/v2"
    headers = {RESTRICTED_KEY_HEADER: state["admin_key"]}
    for request in (
        urllib.request.Request(f"{base}/repository/index", data=b"{}", headers=headers, method="POST"),
        urllib.request.Request(f"{base}/logging", headers=headers),
    ):
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
    reload_models(settings, state, ("embed",))  # our own reload path, with the key from the state file
    with urllib.request.urlopen(f"{base}/models/embed/ready", timeout=10) as response:
        assert response.status == 200


@pytest.mark.integration
def test_requests_in_shared_memory_are_private(served):
    settings, state, _, _ = served
    marker = "hf2triton-marker-prompt-7f3a"
    body = json.dumps({"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [marker]}]}).encode()
    request = urllib.request.Request(
        f"http://{settings.url()}/v2/models/embed/infer", data=body, headers=client.key_headers(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
    regions = stub_regions(state["pid"])
    assert regions
    holding = [r for r in regions if marker.encode() in r.read_bytes()]
    assert holding, "the request should pass through the stub's region (else this test proves nothing)"
    for region in regions:
        info = region.stat()
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid(), (region, oct(info.st_mode))
        denied = as_nobody("cat", str(region))
        assert denied.returncode != 0 and b"Permission denied" in denied.stderr and marker.encode() not in denied.stdout


@pytest.mark.integration
def test_stubs_inherit_neither_the_key_nor_the_shim(served):
    _, state, _, _ = served
    stubs = [c for c in host.descendants(state["pid"]) if "triton_python_backend_stub" in (host.process_cmdline(c) or [""])[0]]
    assert stubs
    for pid in stubs:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert state["admin_key"].encode() not in environ
        assert b"HF2TRITON_ARG_" not in environ and b"argv_from_env" not in environ
    assert state["admin_key"] not in Path(state["log"]).read_text(errors="replace")
