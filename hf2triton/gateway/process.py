"""Start, watch, restore and stop the gateway exactly like tritonserver: a state file (pid, command line, boot
id, a salted digest of the API key; 0600), a log, readiness over HTTP, our process found by its command line,
and the serving lock around every start and stop."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hf2triton import host
from hf2triton.errors import UserError
from hf2triton.fsutil import atomic_write_json
from hf2triton.logs import rotate, without_secrets
from hf2triton.specs import OpenAISpec
from hf2triton.triton import client
from hf2triton.triton.cleanup import group_members, terminate, terminate_group
from hf2triton.triton.ports import LISTEN_FIX, cannot_listen, listening_ports
from hf2triton.triton.settings import Settings, client_address, serving_lock

READY_TIMEOUT_S = 60
VALIDATION_REPORT = "results/validation/report.json"  # rule validate's output, relative to the project directory
VALIDATION_REPORT_ENV = "HF2TRITON_VALIDATION_REPORT"  # how the gateway finds it (the playground's Status view)


def state_file(settings: Settings) -> Path:
    return settings.server_dir / "gateway.json"


def log_file(settings: Settings) -> Path:
    return settings.server_dir / "gateway.log"


def url(settings: Settings, openai: OpenAISpec) -> str:
    """host:port where a local client reaches the gateway (its own bind host, not Triton's)."""
    hostname = client_address(openai.bind_host(settings.host))
    return f"{f'[{hostname}]' if ':' in hostname and not hostname.startswith('[') else hostname}:{openai.port}"


def command(settings: Settings, openai: OpenAISpec) -> list[str]:
    """The gateway's command line (no secret: the API key comes from its environment, Triton's client key from
    client.key_file(), both inherited)."""
    cmd = [
        sys.executable, "-m", "hf2triton.gateway", "--grpc", settings.url("grpc_port"), "--host", openai.bind_host(settings.host),
        "--port", str(openai.port), "--models", ",".join(settings.models), "--api-key-env", openai.api_key_env,
        "--request-timeout-s", f"{openai.request_timeout_s:g}", "--max-audio-upload-mib", str(openai.max_audio_upload_mib),
    ]  # fmt: skip
    if openai.upstream == "http":
        cmd += ["--http", settings.url()]
    workers = openai.worker_count(host.cpu_count())
    if workers > 1:
        cmd += ["--workers", str(workers)]
    if openai.allowed_hosts:
        cmd += ["--allowed-hosts", ",".join(openai.allowed_hosts)]
    if openai.allowed_origins:
        cmd += ["--allowed-origins", ",".join(openai.allowed_origins)]
    if openai.max_embedding_inputs is not None:
        cmd += ["--max-embedding-inputs", str(openai.max_embedding_inputs)]
    return cmd


def _read_state(settings: Settings) -> dict[str, Any] | None:
    try:
        return json.loads(state_file(settings).read_text())
    except (OSError, ValueError):
        return None


def _alive(state: dict[str, Any] | None) -> bool:
    return bool(state) and state.get("boot_id") == host.boot_id() and host.process_cmdline(int(state["pid"])) == state.get("cmdline")


def gateway_alive(settings: Settings) -> bool:
    """The gateway the state file describes is running (the supervisor's check)."""
    return _alive(_read_state(settings))


def _health(settings: Settings, openai: OpenAISpec) -> tuple[int, str]:
    """The gateway's own /health: 200 (Triton ready), 503 (the gateway answers, Triton is not ready), 0 (nothing)."""
    return client.http_get(f"http://{url(settings, openai)}/health", timeout=2)


def _healthy(settings: Settings, openai: OpenAISpec) -> bool:
    return _health(settings, openai)[0] in (200, 503)  # it answers; Triton may not be ready (yet)


def api_key_digest(openai: OpenAISpec, salt: str) -> str:
    """A keyed digest of the API key in the environment now ('' without one): the state file never holds the key,
    yet a changed key restarts the gateway (the old one would keep accepting the old key)."""
    key = os.environ.get(openai.api_key_env, "")
    return client.key_digest(key, salt) if key else ""


def _current(state: dict[str, Any] | None, settings: Settings, openai: OpenAISpec) -> bool:
    """The gateway the state file describes runs with this command line and this API key."""
    return (
        _alive(state)
        and state.get("cmdline") == command(settings, openai)
        and state.get("api_key_digest") == api_key_digest(openai, state.get("salt", ""))
    )


def exposure(openai: OpenAISpec, server_host: str) -> dict[str, str]:
    """What the API-key policy needs to know (also validate's rule param, so it stays small and changes only with
    this): where the gateway listens when it is enabled beyond loopback, else {}."""
    bind = openai.bind_host(server_host)
    if not openai.enabled or client.is_loopback(bind):
        return {}
    return {"field": "openai.host" if openai.host else "server.host", "host": bind, "api_key_env": openai.api_key_env}


def require_api_key(exposed: dict[str, str]) -> None:
    """A gateway reachable beyond this machine needs an API key: refused before anything running is touched
    (validate, serve and bench call this before their ensure_server)."""
    if exposed and not os.environ.get(exposed["api_key_env"]):
        via = "" if exposed["field"] == "openai.host" else " (openai.host unset: the gateway binds server.host)"
        raise UserError(
            f"openai.enabled with {exposed['field']} = {exposed['host']!r}{via}, not loopback, and no API key in "
            f"${exposed['api_key_env']} (openai.api_key_env); nothing running was touched",
            f"export {exposed['api_key_env']}=<a long random secret> before `make serve`, or set openai.host: 127.0.0.1 "
            "(the gateway on this machine only)",
        )


def _ours(settings: Settings, state: dict[str, Any] | None) -> list[int]:
    """Our gateways for this Triton: the state file's, and any other (a lost state file) found by command line."""
    pids = [int(state["pid"])] if _alive(state) else []
    marker = ["-m", "hf2triton.gateway", "--grpc", settings.url("grpc_port")]
    for pid in host.pids():
        if pid not in pids and (host.process_cmdline(pid) or [])[1:5] == marker:
            pids.append(pid)
    return pids


def _group(state: dict[str, Any] | None) -> list[int]:
    """The live processes of the state file's gateway's process group (it leads its own session): with it gone, its
    uvicorn workers (and their resource tracker) live on, answering on its port, and no command line tells them
    apart. Its pid is not reused while they remain in its group, so they are ours -- unless that pid now runs
    another program (then none of ours remain, and the group is that program's)."""
    if not state or state.get("boot_id") != host.boot_id():
        return []
    pid = int(state["pid"])
    if not host.process_gone(pid) and host.process_cmdline(pid) != state.get("cmdline"):
        return []
    return group_members(pid)


def _check_can_listen(settings: Settings, openai: OpenAISpec, replaced: list[int]) -> None:
    """Before a running gateway is stopped: its new host and port must be usable (free, or held by a gateway of
    ours about to be replaced), so a bad openai.host or a taken openai.port leaves the old one serving."""
    bind, note = openai.bind_host(settings.host), "; nothing was stopped: the running gateway keeps serving"
    field = "openai.host" if openai.host else "server.host"
    problem = cannot_listen(bind)
    if problem:
        raise UserError(f"{field} = {bind!r}: this machine cannot listen on that address for the gateway ({problem}){note}", LISTEN_FIX)
    held = set().union(*(listening_ports(pid) for pid in replaced))
    if openai.port not in held and not host.port_is_free(bind, openai.port):
        raise UserError(
            f"openai.port {openai.port} on {bind} is in use by another program{note}",
            "choose another openai.port, or stop what listens there",
        )


def ensure_gateway(settings: Settings, openai: OpenAISpec) -> dict[str, Any]:
    """The gateway up with this command line (same Triton, host, port, models, limits) and this API key: kept if
    it is, else (re)started. Checked before the old one stops: the key policy, the host and the port."""
    require_api_key(exposure(openai, settings.host))
    with serving_lock(settings):
        state = _read_state(settings)
        if _current(state, settings, openai) and _healthy(settings, openai):
            return {"action": "kept", "pid": state["pid"], "url": url(settings, openai)}
        replaced = list(dict.fromkeys(_ours(settings, state) + _group(state)))  # a dead gateway's workers hold its port
        _check_can_listen(settings, openai, replaced)
        stop_gateway(settings)
        return _start(settings, openai)


def _start(settings: Settings, openai: OpenAISpec) -> dict[str, Any]:
    wanted = command(settings, openai)
    log_file(settings).parent.mkdir(parents=True, exist_ok=True)
    rotate(log_file(settings))
    with open(log_file(settings), "ab") as log:
        env = {**without_secrets(os.environ), VALIDATION_REPORT_ENV: str(Path(VALIDATION_REPORT).resolve())}  # the playground's Status view
        process = subprocess.Popen(wanted, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env)  # noqa: S603
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            _end_started(process)
            tail = log_file(settings).read_text(errors="replace").splitlines()[-8:]
            raise UserError(f"the gateway exited ({process.returncode}): " + " | ".join(tail), f"read {log_file(settings)}")
        if _healthy(settings, openai):
            salt = secrets.token_hex(16)
            state = {
                "pid": process.pid,
                "cmdline": host.process_cmdline(process.pid),
                "boot_id": host.boot_id(),
                "salt": salt,
                "api_key_digest": api_key_digest(openai, salt),
            }
            atomic_write_json(state_file(settings), state, mode=0o600)
            return {"action": "started", "pid": process.pid, "url": url(settings, openai)}
        time.sleep(0.2)
    _end_started(process)
    raise UserError(f"the gateway did not answer within {READY_TIMEOUT_S} s", f"read {log_file(settings)}")


def _end_started(process: subprocess.Popen) -> None:
    """SIGKILL the gateway this call started (it failed to come up) and whatever it spawned: its process group. Not yet
    waited for, or while members remain, its pid cannot have been reused."""
    if process.poll() is None or group_members(process.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def stop_gateway(settings: Settings) -> str:
    """Stop our gateway: the state file's, and any other serving this Triton (a lost state file); and what is left
    of the state file's one after its death (its workers)."""
    with serving_lock(settings):
        state = _read_state(settings)
        pids = _ours(settings, state)
        for pid in pids:
            terminate(pid, host.process_cmdline(pid))
        left = _group(state)
        if left:
            terminate_group(int(state["pid"]))
        state_file(settings).unlink(missing_ok=True)
    stopped = [f"pid {', '.join(map(str, pids))}"] * bool(pids) + [f"workers left by a dead one: {', '.join(map(str, left))}"] * bool(left)
    return f"stopped the gateway ({'; '.join(stopped)})" if stopped else "no gateway of ours is running"


def gateway_status(settings: Settings, openai: OpenAISpec) -> dict[str, Any]:
    state = _read_state(settings)
    running = _alive(state)
    status, body = _health(settings, openai) if running else (0, "")
    return {
        "enabled": openai.enabled,
        "running": running,
        "pid": state["pid"] if running else None,
        "url": f"http://{url(settings, openai)}/v1",
        "healthy": status == 200,  # what its own /health says (one source): 503 while Triton is not ready
        "health": f"{status or 'no answer'} {body[:200]}".strip() if running else "not running",
        "current": _current(state, settings, openai),  # also: the API key it checks is the one set now
    }
