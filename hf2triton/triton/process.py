"""Launch, watch, reload and stop a standalone tritonserver (no Docker); its state file and the restart decision.

The server outlives Snakemake. Its state file (pid, boot id, command line, ports, repository digest) is
deliberately not a rule output: every `serve` checks the real process against it and keeps, starts,
reloads or restarts the server.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf2triton import host
from hf2triton.errors import UserError
from hf2triton.fsutil import atomic_write_json
from hf2triton.specs import ServerSpec
from hf2triton.triton import client
from hf2triton.triton.install import Installation, locate_tritonserver, prepare_backend_dir, server_environment
from hf2triton.triton.modelconfig import instance_count, model_parameters, read_model_config_or_none
from hf2triton.triton.pitfalls import explain, relevant_log_lines

log = logging.getLogger(__name__)

# APIs that change server state stay closed unless the caller has the key from the (0600) state file.
RESTRICTED_HTTP_APIS = "model-repository,shared-memory,trace,logging"
RESTRICTED_KEY_HEADER = "hf2triton-admin"
STOP_TIMEOUT_S = 30
REPOSITORY = "model_repository"  # the rendered repository, relative to the project directory


@dataclass
class Settings:
    """One server of ours: the config's server spec, the repository it serves, the work directory (state,
    log, backends) and the models it loads."""

    server: ServerSpec
    repository: str
    work: str
    models: list[str]

    def __post_init__(self) -> None:
        self.repository = str(Path(self.repository).resolve())
        self.work = str(Path(self.work).resolve())
        self.models = list(self.models)

    @property
    def host(self) -> str:
        return self.server.host

    @property
    def ports(self) -> dict[str, int]:
        return self.server.ports

    @property
    def server_dir(self) -> Path:
        return Path(self.work) / "server"

    @property
    def state_file(self) -> Path:
        return self.server_dir / "state.json"

    @property
    def log_file(self) -> Path:
        return self.server_dir / "tritonserver.log"

    @property
    def client_host(self) -> str:
        """Where a local client connects: loopback when the server listens on all addresses."""
        return {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}.get(self.host, self.host)  # noqa: S104

    def url(self, port_key: str = "http_port") -> str:
        address = f"[{self.client_host.strip('[]')}]" if ":" in self.client_host else self.client_host
        return f"{address}:{self.ports[port_key]}"

    @property
    def urls(self) -> dict[str, str]:
        """host:port per protocol, for clients on this machine."""
        return {"http": self.url(), "grpc": self.url("grpc_port"), "metrics": self.url("metrics_port")}

    @property
    def endpoints(self) -> dict[str, str]:
        """What a user connects to (reports, status, messages)."""
        return {"http": f"http://{self.url()}", "grpc": self.url("grpc_port"), "metrics": f"http://{self.url('metrics_port')}/metrics"}

    @classmethod
    def of(cls, server: ServerSpec, models: list[str], work: str, repository: str = REPOSITORY) -> Settings:
        return cls(server, repository, work, models)


def server_command(install: Installation, settings: Settings, backend_dir: str, admin_key: str) -> list[str]:
    host_addr = settings.host
    cmd = [
        install.binary,
        f"--model-repository={settings.repository}",
        "--model-control-mode=explicit",
        *[f"--load-model={name}" for name in settings.models],
        f"--backend-directory={backend_dir}",
        f"--http-address={host_addr}",
        f"--http-port={settings.server.http_port}",
        f"--grpc-address={host_addr}",
        f"--grpc-port={settings.server.grpc_port}",
        f"--metrics-address={host_addr}",
        f"--metrics-port={settings.server.metrics_port}",
        f"--log-verbose={settings.server.log_verbose}",
        "--exit-on-error=true",
        "--exit-timeout-secs=10",
        "--strict-readiness=true",
        f"--backend-config=python,shm-default-byte-size={settings.server.shm_default_byte_size}",
        f"--http-restricted-api={RESTRICTED_HTTP_APIS}:{RESTRICTED_KEY_HEADER}={admin_key}",
        f"--grpc-restricted-protocol={RESTRICTED_HTTP_APIS}:{RESTRICTED_KEY_HEADER}={admin_key}",
    ]
    if not host.has_gpu():
        cmd.append("--allow-gpu-metrics=false")
    return cmd


def redacted_command(cmd: list[str]) -> list[str]:
    """The command line without the admin key (for logs and reports)."""
    return [arg.rsplit("=", 1)[0] + "=***" if "restricted" in arg else arg for arg in cmd]


def model_digest(settings: Settings, name: str) -> str:
    """Digest of what the server loads for one model: config.pbtxt, model.py, saved-model manifest."""
    digest = hashlib.sha256()
    model_dir = Path(settings.repository) / name
    for path in sorted(model_dir.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(model_dir)).encode() + b"\0" + path.read_bytes())
    config = model_dir / "config.pbtxt"
    if config.is_file():
        manifest = _model_dir_of(config) / "hf2triton.json"
        if manifest.is_file():
            digest.update(str(manifest.stat().st_mtime_ns).encode() + manifest.read_bytes())
    return digest.hexdigest()


def model_digests(settings: Settings) -> dict[str, str]:
    return {name: model_digest(settings, name) for name in sorted(settings.models)}


def expected_instances(settings: Settings, name: str) -> int:
    return instance_count(read_model_config_or_none(Path(settings.repository) / name / "config.pbtxt"))


def dead_stub_models(settings: Settings, server_pid: int) -> list[str]:
    """Models with fewer live Python-backend stub processes than instances. A killed stub leaves the
    model "ready" while every request fails with 'Stub process ... is not healthy'."""
    cmdlines = [host.process_cmdline(pid) or [] for pid in host.descendants(server_pid)]
    dead = []
    for name in settings.models:
        marker = f"{settings.repository}/{name}/"
        alive = sum(1 for cmd in cmdlines if len(cmd) > 1 and "triton_python_backend_stub" in cmd[0] and cmd[1].startswith(marker))
        if alive < expected_instances(settings, name):
            dead.append(name)
    return dead


def _model_dir_of(config_path: Path) -> Path:
    config = read_model_config_or_none(config_path)
    return Path((model_parameters(config).model_dir if config else "") or "/nonexistent")


# ---------------------------------------------------------------- state


def read_state(settings: Settings) -> dict[str, Any] | None:
    try:
        return json.loads(settings.state_file.read_text())
    except (OSError, ValueError):
        return None


def write_state(settings: Settings, state: dict[str, Any]) -> None:
    atomic_write_json(settings.state_file, state, mode=0o600)


def is_ready(settings: Settings) -> bool:
    return client.is_ready(settings.url())


@dataclass
class Facts:
    """What is observed now about the server the state file describes."""

    boot_id: str
    pid_alive: bool
    cmdline_matches: bool
    ready: bool
    digests: dict[str, str]
    dead_stubs: list[str] = field(default_factory=list)


def observe(settings: Settings, state: dict[str, Any] | None) -> Facts:
    alive = matches = ready = False
    if state and state.get("boot_id") == host.boot_id():
        cmdline = host.process_cmdline(int(state["pid"]))
        alive = cmdline is not None
        matches = alive and cmdline == state.get("cmdline")
        ready = matches and is_ready(settings)
    dead = dead_stub_models(settings, int(state["pid"])) if ready else []
    return Facts(host.boot_id(), alive, matches, ready, model_digests(settings), dead)


@dataclass(frozen=True)
class Decision:
    action: str  # "keep" | "start" | "restart" | "reload"
    reason: str
    models: tuple[str, ...] = ()  # for "reload": the models to unload and load again


def decide(state: dict[str, Any] | None, facts: Facts, wanted_cmdline: list[str] | None) -> Decision:
    """What to do with the server. Pure: unit-tested with every combination."""
    if not state:
        return Decision("start", "no server started yet")
    if state.get("boot_id") != facts.boot_id:
        return Decision("start", "the machine rebooted (or the session was restored) since the server started")
    if not facts.pid_alive:
        return Decision("start", f"server process {state.get('pid')} is gone")
    if not facts.cmdline_matches:
        return Decision("start", f"pid {state.get('pid')} now belongs to another program")
    if wanted_cmdline is not None and redacted_command(state.get("cmdline", [])) != redacted_command(wanted_cmdline):
        return Decision("restart", "server settings changed (ports, host, models or flags)")
    if not facts.ready:
        return Decision("restart", "server is running but not ready")
    recorded = state.get("digests", {})
    changed = tuple(name for name, digest in facts.digests.items() if recorded.get(name) != digest)
    dead = tuple(name for name in facts.dead_stubs if name not in changed)
    if changed or dead:
        reasons = [f"changed: {', '.join(changed)}"] * bool(changed) + [f"stub process died: {', '.join(dead)}"] * bool(dead)
        return Decision("reload", "; ".join(reasons), changed + dead)
    return Decision("keep", "running, ready and current")


# ---------------------------------------------------------------- start / stop


def _check_ports(settings: Settings) -> None:
    for key, port in settings.ports.items():
        if not host.port_is_free(settings.host, port):
            raise UserError(
                f"port {port} (server.{key}) on {settings.host} is already in use by another program",
                f"stop that program or set server.{key} in config.yaml to a free port",
            )


def _terminate(pid: int, cmdline: list[str] | None) -> None:
    """Stop our server (process group), politely first."""
    if cmdline is not None and host.process_cmdline(pid) != cmdline:
        return
    for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 5)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                reaped, _ = os.waitpid(pid, os.WNOHANG)
                if reaped == pid:
                    return
            except ChildProcessError:
                pass
            if host.process_cmdline(pid) is None:
                return
            time.sleep(0.2)


def stop_server(settings: Settings) -> str:
    state = read_state(settings)
    if not state or state.get("boot_id") != host.boot_id():
        return "no server of ours is running"
    pid = int(state["pid"])
    if host.process_cmdline(pid) != state.get("cmdline"):
        settings.state_file.unlink(missing_ok=True)
        return "no server of ours is running (stale state removed)"
    _terminate(pid, state.get("cmdline"))
    settings.state_file.unlink(missing_ok=True)
    return f"stopped tritonserver (pid {pid})"


def _failure(settings: Settings, what: str) -> UserError:
    text = settings.log_file.read_text(errors="replace") if settings.log_file.exists() else ""
    lines = relevant_log_lines(text)
    fixes = []
    for pitfall in explain("\n".join(lines) or text):
        fixes.append(f"{pitfall.cause}: {pitfall.fix}")
    detail = "\n  ".join(lines[-10:]) or "(the log is empty)"
    print(f"tritonserver log ({settings.log_file}), relevant lines:\n  {detail}", file=sys.stderr)
    return UserError(f"{what}; see {settings.log_file}", "; ".join(dict.fromkeys(fixes)) or "read the log lines above")


def start_server(settings: Settings, install: Installation | None = None) -> dict[str, Any]:
    install = install or locate_tritonserver()
    _check_ports(settings)
    backend_dir = prepare_backend_dir(install, settings.server_dir)
    admin_key = secrets.token_urlsafe(24)
    cmd = server_command(install, settings, backend_dir, admin_key)
    settings.server_dir.mkdir(parents=True, exist_ok=True)
    if settings.log_file.exists():
        os.replace(settings.log_file, settings.log_file.with_suffix(".log.1"))
    log.info("starting tritonserver (%s) on %s: http %d, grpc %d, metrics %d", install.origin, settings.host, *settings.ports.values())
    fd = os.open(settings.log_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as log_handle:
        process = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_handle,
            stderr=subprocess.STDOUT,
            env=server_environment(install),
            start_new_session=True,  # outlives snakemake and its process group
            cwd=settings.server_dir,
        )
    state = {
        "pid": process.pid,
        "boot_id": host.boot_id(),
        "cmdline": cmd,
        "admin_key": admin_key,
        "ports": settings.ports,
        "host": settings.host,
        "repository": settings.repository,
        "models": settings.models,
        "digests": model_digests(settings),
        "origin": install.origin,
        "log": str(settings.log_file),
        "started_at": time.time(),
        "ready": False,
    }
    write_state(settings, state)
    wait_until_ready(settings, process)
    state.update(ready=True, ready_after_s=round(time.time() - state["started_at"], 1))
    write_state(settings, state)
    log.info("tritonserver ready after %.1f s (pid %d, log %s)", state["ready_after_s"], process.pid, settings.log_file)
    return state


def _loaded_models(log_text: str, models: list[str]) -> list[str]:
    return [m for m in models if f"successfully loaded '{m}'" in log_text]


def wait_until_ready(settings: Settings, process: subprocess.Popen) -> None:
    """Poll /v2/health/ready while watching the process and its log; explain failures."""
    started = time.monotonic()
    last_report = started
    while True:
        if process.poll() is not None:
            raise _failure(settings, f"tritonserver exited with status {process.returncode} during startup")
        if is_ready(settings):
            return
        elapsed = time.monotonic() - started
        if elapsed > settings.server.startup_timeout_s:
            _terminate(process.pid, None)
            raise _failure(settings, f"tritonserver not ready after {settings.server.startup_timeout_s} s (server.startup_timeout_s)")
        if time.monotonic() - last_report >= 10:
            text = settings.log_file.read_text(errors="replace")
            loaded = _loaded_models(text, settings.models)
            pending = [m for m in settings.models if m not in loaded]
            log.info(
                "waiting for tritonserver: %.0f s; loaded: %s; loading: %s", elapsed, ", ".join(loaded) or "-", ", ".join(pending) or "-"
            )
            last_report = time.monotonic()
        time.sleep(0.25)


def reload_models(settings: Settings, state: dict[str, Any], models: tuple[str, ...]) -> None:
    """Unload and load models in the running server (explicit model control, restricted API with the
    admin key from the state file); the other models keep serving."""
    headers = {RESTRICTED_KEY_HEADER: state["admin_key"]}
    base = f"http://{settings.url()}/v2"
    for name in models:
        started = time.monotonic()
        client.http_post(f"{base}/repository/models/{name}/unload", headers)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while client.model_ready(settings.url(), name) and time.monotonic() < deadline:
            time.sleep(0.2)
        status, body = client.http_post(f"{base}/repository/models/{name}/load", headers, timeout=settings.server.startup_timeout_s)
        if status != 200:
            raise _failure(settings, f"reloading model {name} failed ({status}: {body[:300]})")
        log.info("reloaded %s in %.1f s", name, time.monotonic() - started)


def ensure_server(settings: Settings) -> dict[str, Any]:
    """Keep a current, ready server: start, restart, or reload only the models that changed."""
    install = locate_tritonserver()
    state = read_state(settings)
    facts = observe(settings, state)
    wanted = None
    if state and facts.cmdline_matches:
        backend_dir = prepare_backend_dir(install, settings.server_dir)
        wanted = server_command(install, settings, backend_dir, state.get("admin_key", ""))
    decision = decide(state, facts, wanted)
    log.info("server: %s (%s)", decision.action, decision.reason)
    if decision.action == "reload":
        reload_models(settings, state, decision.models)
        state["digests"] = model_digests(settings)
        write_state(settings, state)
    if decision.action == "restart":
        _terminate(int(state["pid"]), state.get("cmdline"))
    if decision.action in ("start", "restart"):
        state = start_server(settings, install)
    return {**state, "action": decision.action, "reason": decision.reason}


def server_status(settings: Settings) -> dict[str, Any]:
    state = read_state(settings)
    facts = observe(settings, state)
    status: dict[str, Any] = {
        "running": facts.cmdline_matches,
        "ready": facts.ready,
        "current": bool(state) and state.get("digests") == facts.digests and not facts.dead_stubs,
        **settings.endpoints,
        "log": str(settings.log_file),
    }
    if state and facts.cmdline_matches:
        status.update(pid=state["pid"], uptime_s=round(time.time() - state["started_at"]), origin=state.get("origin"))
        status["models"] = {name: client.model_ready(settings.url(), name) for name in state.get("models", [])}
    return status


def public_state(state: dict[str, Any]) -> dict[str, Any]:
    """State without secrets, for reports."""
    out = {k: v for k, v in state.items() if k != "admin_key"}
    if "cmdline" in out:
        out["cmdline"] = redacted_command(out["cmdline"])
    return out
