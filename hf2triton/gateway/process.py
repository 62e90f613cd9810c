"""Start, watch, restore and stop the gateway exactly like tritonserver: a state file (pid, command line, boot
id), a log, readiness over HTTP, and our process found by its command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hf2triton import host
from hf2triton.errors import UserError
from hf2triton.fsutil import atomic_write_json
from hf2triton.specs import OpenAISpec
from hf2triton.triton import client
from hf2triton.triton.process import Settings, terminate

READY_TIMEOUT_S = 60


def state_file(settings: Settings) -> Path:
    return settings.server_dir / "gateway.json"


def log_file(settings: Settings) -> Path:
    return settings.server_dir / "gateway.log"


def url(settings: Settings, openai: OpenAISpec) -> str:
    hostname = settings.client_host
    return f"{f'[{hostname}]' if ':' in hostname and not hostname.startswith('[') else hostname}:{openai.port}"


def command(settings: Settings, openai: OpenAISpec) -> list[str]:
    return [
        sys.executable, "-m", "hf2triton.gateway", "--grpc", settings.url("grpc_port"), "--host", settings.host,
        "--port", str(openai.port), "--models", ",".join(settings.models), "--api-key-env", openai.api_key_env,
    ]  # fmt: skip


def _read_state(settings: Settings) -> dict[str, Any] | None:
    try:
        return json.loads(state_file(settings).read_text())
    except (OSError, ValueError):
        return None


def _alive(state: dict[str, Any] | None) -> bool:
    return bool(state) and state.get("boot_id") == host.boot_id() and host.process_cmdline(int(state["pid"])) == state.get("cmdline")


def _healthy(settings: Settings, openai: OpenAISpec) -> bool:
    status, _ = client.http_get(f"http://{url(settings, openai)}/health", timeout=2)
    return status in (200, 503)  # 503: the gateway answers, Triton is not ready (yet)


def check_key_policy(settings: Settings, openai: OpenAISpec) -> None:
    if not client.is_loopback(settings.host) and not os.environ.get(openai.api_key_env):
        raise UserError(
            f"openai.enabled on server.host = {settings.host!r} (not loopback) without an API key",
            f"export {openai.api_key_env}=<a secret> before `make serve`, or keep server.host at 127.0.0.1",
        )


def ensure_gateway(settings: Settings, openai: OpenAISpec) -> dict[str, Any]:
    """The gateway up with this command line (same Triton, port, models, key variable): kept if it is, else
    (re)started. Checked before the old one stops: the key policy and the port."""
    check_key_policy(settings, openai)
    wanted = command(settings, openai)
    state = _read_state(settings)
    if _alive(state) and state.get("cmdline") == wanted and state.get("key_set") == bool(os.environ.get(openai.api_key_env)):
        if _healthy(settings, openai):
            return {"action": "kept", "pid": state["pid"], "url": url(settings, openai)}
    stop_gateway(settings)
    if not host.port_is_free(settings.host, openai.port):
        raise UserError(
            f"openai.port {openai.port} on {settings.host} is in use by another program",
            "choose another openai.port, or stop what listens there",
        )
    log_file(settings).parent.mkdir(parents=True, exist_ok=True)
    with open(log_file(settings), "ab") as log:
        process = subprocess.Popen(wanted, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)  # noqa: S603
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_file(settings).read_text(errors="replace").splitlines()[-8:]
            raise UserError(f"the gateway exited ({process.returncode}): " + " | ".join(tail), f"read {log_file(settings)}")
        if _healthy(settings, openai):
            cmdline = host.process_cmdline(process.pid)
            atomic_write_json(
                str(state_file(settings)),
                {"pid": process.pid, "cmdline": cmdline, "boot_id": host.boot_id(), "key_set": bool(os.environ.get(openai.api_key_env))},
            )
            return {"action": "started", "pid": process.pid, "url": url(settings, openai)}
        time.sleep(0.2)
    process.kill()
    raise UserError(f"the gateway did not answer within {READY_TIMEOUT_S} s", f"read {log_file(settings)}")


def stop_gateway(settings: Settings) -> str:
    """Stop our gateway: the state file's, and any other serving this Triton (a lost state file)."""
    state = _read_state(settings)
    pids = [int(state["pid"])] if _alive(state) else []
    marker = ["-m", "hf2triton.gateway", "--grpc", settings.url("grpc_port")]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in pids:
            cmd = host.process_cmdline(int(entry.name)) or []
            if cmd[1:5] == marker:
                pids.append(int(entry.name))
    for pid in pids:
        terminate(pid, host.process_cmdline(pid))
    state_file(settings).unlink(missing_ok=True)
    return f"stopped the gateway (pid {', '.join(map(str, pids))})" if pids else "no gateway of ours is running"


def gateway_status(settings: Settings, openai: OpenAISpec) -> dict[str, Any]:
    state = _read_state(settings)
    running = _alive(state)
    return {
        "enabled": openai.enabled,
        "running": running,
        "pid": state["pid"] if running else None,
        "url": f"http://{url(settings, openai)}/v1",
        "healthy": running and _healthy(settings, openai),
        "current": running and state.get("cmdline") == command(settings, openai),
    }
