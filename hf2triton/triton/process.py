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
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf2triton import host, integrity
from hf2triton.errors import UserError
from hf2triton.fsutil import atomic_write_json
from hf2triton.locks import exclusive
from hf2triton.specs import ServerSpec
from hf2triton.triton import client, mps
from hf2triton.triton.hidden_args import build_shim, hide_arguments, placeholder
from hf2triton.triton.install import Installation, locate_tritonserver, prepare_backend_dir, server_environment
from hf2triton.triton.modelconfig import instance_count, model_parameters, read_model_config_or_none, uses_gpu
from hf2triton.triton.pitfalls import explain, relevant_log_lines

log = logging.getLogger(__name__)

# APIs that change server state stay closed unless the caller has the key from the (0600) state file.
RESTRICTED_HTTP_APIS = "model-repository,shared-memory,trace,logging"
RESTRICTED_KEY_HEADER = "hf2triton-admin"
STOP_TIMEOUT_S = 30
LOCK_WAIT_S = 300  # beyond server.startup_timeout_s: how long a second serve/validate/bench/stop waits for the first
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
        return client_address(self.host)

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


def client_address(bind_host: str) -> str:
    """Where a local client connects to a server bound to `bind_host`: loopback for all addresses."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}.get(bind_host, bind_host)  # noqa: S104


def serving_lock(settings: Settings) -> Any:
    """One start, restart or stop of this work directory's servers (tritonserver and gateway) at a time: two
    `serve` after a crash would otherwise both start one (the second then sees the first's server and keeps it)."""
    wait = settings.server.startup_timeout_s + LOCK_WAIT_S
    return exclusive(settings.server_dir / "serve.lock", wait, f"starting or stopping the server in {settings.work}")


def restricted_arguments(admin_key: str, client_key: str) -> dict[str, str]:
    """The flags that carry the admin key and the client key (client.KEY_HEADER: metadata, inference,
    model-config, statistics), by the environment variable that passes each to the server (hidden_args: the
    command line holds placeholders; /proc/<pid>/cmdline is world-readable). Health stays open."""
    admin = f"{RESTRICTED_HTTP_APIS}:{RESTRICTED_KEY_HEADER}={admin_key}"
    clients = f"{client.CLIENT_KEY_APIS}:{client.KEY_HEADER}={client_key}"
    return {
        "HF2TRITON_ARG_HTTP_RESTRICTED_API": f"--http-restricted-api={admin}",
        "HF2TRITON_ARG_GRPC_RESTRICTED_PROTOCOL": f"--grpc-restricted-protocol={admin}",
        "HF2TRITON_ARG_HTTP_CLIENT_API": f"--http-restricted-api={clients}",
        "HF2TRITON_ARG_GRPC_CLIENT_PROTOCOL": f"--grpc-restricted-protocol={clients}",
    }


def listen_addresses(host_address: str) -> dict[str, str]:
    """The address flags tritonserver understands: its HTTP and metrics servers (libevhtp) read an IPv6
    address only as `ipv6:<addr>` (a bare `::1` binds 255.255.255.255), its gRPC server only as `[<addr>]`."""
    bare = host_address.strip("[]")
    if ":" not in bare:
        return {"http": bare, "grpc": bare}
    return {"http": f"ipv6:{bare}", "grpc": f"[{bare}]"}


def server_command(install: Installation, settings: Settings, backend_dir: str, admin_key: str) -> list[str]:
    """The command as /proc/<pid>/cmdline shows it (kept in the state file): placeholders instead of the
    key-carrying flags; start_server passes the real flags in the environment."""
    addresses = listen_addresses(settings.host)
    cmd = [
        install.binary,
        f"--model-repository={settings.repository}",
        "--model-control-mode=explicit",
        *[f"--load-model={name}" for name in settings.models],
        f"--backend-directory={backend_dir}",
        f"--http-address={addresses['http']}",
        f"--http-port={settings.server.http_port}",
        f"--grpc-address={addresses['grpc']}",
        f"--grpc-port={settings.server.grpc_port}",
        f"--metrics-address={addresses['http']}",
        f"--metrics-port={settings.server.metrics_port}",
        f"--log-verbose={settings.server.log_verbose}",
        "--exit-on-error=false",  # one model failing to load must not take the others down
        "--exit-timeout-secs=10",
        "--strict-readiness=true",
        f"--backend-config=python,shm-default-byte-size={settings.server.shm_default_byte_size}",
        *[placeholder(name) for name in restricted_arguments(admin_key, "")],  # the keys stay off /proc/<pid>/cmdline
    ]
    if not host.has_gpu():
        cmd.append("--allow-gpu-metrics=false")
    return cmd


def redacted_command(cmd: list[str]) -> list[str]:
    """The command line without an admin key (for logs and reports). Ours hold placeholders only; this also
    masks the key of a server started by an older hf2triton (so that one counts as changed and restarts)."""
    return [arg.rsplit("=", 1)[0] + "=***" if f"{RESTRICTED_KEY_HEADER}=" in arg else arg for arg in cmd]


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


def gpu_processes(settings: Settings) -> int:
    """How many stub processes of the rendered models run on the GPU (each has its own CUDA context)."""
    configs = [read_model_config_or_none(Path(settings.repository) / name / "config.pbtxt") for name in settings.models]
    return sum(instance_count(config) for config in configs if config is not None and uses_gpu(config))


def mps_plan(settings: Settings) -> mps.Plan:
    return mps.plan(settings.server.cuda_mps, gpu_processes(settings), settings.server_dir)


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
    live: bool = True  # the server answers /v2/health/live (it may be live with a model not ready)
    not_ready: list[str] = field(default_factory=list)  # models that are not ready in a live server
    client_key_digest: str = ""  # of the client key file now, salted as the state's (a changed file -> restart)


def _key_or_empty() -> str:
    """The client key now, '' when the file is gone (serve then makes a new one and restarts the server)."""
    try:
        return client.client_key()
    except UserError:
        return ""


def observe(settings: Settings, state: dict[str, Any] | None) -> Facts:
    alive = matches = ready = live = False
    not_ready: list[str] = []
    if state and state.get("boot_id") == host.boot_id():
        cmdline = host.process_cmdline(int(state["pid"]))
        alive = cmdline is not None
        matches = alive and cmdline == state.get("cmdline")
        ready = matches and is_ready(settings)
        live = ready or (matches and client.is_live(settings.url()))
        if live and not ready:
            not_ready = [name for name in settings.models if not client.model_ready(settings.url(), name)]
    dead = dead_stub_models(settings, int(state["pid"])) if live else []
    key = client.key_digest(_key_or_empty(), state.get("admin_key", "")) if state else ""
    return Facts(host.boot_id(), alive, matches, ready, model_digests(settings), dead, live, not_ready, key)


@dataclass(frozen=True)
class Decision:
    action: str  # "keep" | "start" | "restart" | "reload"
    reason: str
    models: tuple[str, ...] = ()  # for "reload": the models to load again
    broken: tuple[str, ...] = ()  # of those, the ones that serve nothing now (unloaded first: Triton skips an unchanged load)


def decide(state: dict[str, Any] | None, facts: Facts, wanted_cmdline: list[str] | None, wanted_mps: bool = False) -> Decision:
    """What to do with the server. Pure: unit-tested with every combination. `wanted_mps`: whether the
    server should run under our CUDA MPS daemon (an environment setting: only a restart changes it)."""
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
    if wanted_cmdline is not None and state.get("client_key_digest", "") != facts.client_key_digest:
        return Decision("restart", f"the client key ({client.key_file()}) changed since the server started")
    if wanted_cmdline is not None and state.get("cuda_mps", {}).get("wanted", False) != wanted_mps:
        return Decision("restart", f"CUDA MPS {'on' if wanted_mps else 'off'} (server.cuda_mps)")
    if not facts.ready and not (facts.live and facts.not_ready):
        return Decision("restart", "server is running but not ready")
    recorded = state.get("digests", {})
    changed = tuple(name for name, digest in facts.digests.items() if recorded.get(name) != digest)
    dead = tuple(name for name in facts.dead_stubs if name not in changed)
    down = tuple(name for name in facts.not_ready if name not in changed + dead)
    if changed or dead or down:
        reasons = (
            [f"changed: {', '.join(changed)}"] * bool(changed)
            + [f"stub process died: {', '.join(dead)}"] * bool(dead)
            + [f"not ready: {', '.join(down)}"] * bool(down)
        )
        return Decision("reload", "; ".join(reasons), changed + dead + down, dead + down)
    return Decision("keep", "running, ready and current")


# ---------------------------------------------------------------- start / stop


def listening_ports(pid: int) -> set[int]:
    """TCP ports `pid` listens on (from /proc/net/tcp{,6} and its socket inodes)."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return set()
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:  # 0A = LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def cannot_listen(host_address: str) -> str:
    """Why this machine cannot listen on `host_address` ('' when it can)."""
    family = socket.AF_INET6 if ":" in host_address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host_address.strip("[]"), 0))
    except (OSError, UnicodeError) as err:
        return str(err)
    return ""


LISTEN_FIX = "use 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or an address of this machine"


def check_can_listen(settings: Settings, held_by_replaced: list[int]) -> None:
    """Before a running server is stopped: the new host must be an address this machine can listen on, and
    each port must be free or held by a server about to be replaced (so a bad host or a taken port leaves
    the old server serving)."""
    problem = cannot_listen(settings.host)
    if problem:
        what = f"server.host = {settings.host!r}: this machine cannot listen on that address ({problem}); nothing was stopped"
        raise UserError(what, LISTEN_FIX)
    ours = set().union(*(listening_ports(pid) for pid in held_by_replaced)) if held_by_replaced else set()
    _check_ports(settings, ours, "; the running server keeps serving")


def _check_ports(settings: Settings, held_by_us: set[int] | None = None, note: str = "") -> None:
    """Every port free (or in `held_by_us`), else a UserError naming the config key."""
    for key, port in settings.ports.items():
        if port not in (held_by_us or set()) and not host.port_is_free(settings.host, port):
            raise UserError(
                f"port {port} (server.{key}) on {settings.host} is already in use by another program{note}",
                f"stop that program or set server.{key} in config.yaml to a free port",
            )


def terminate(pid: int, cmdline: list[str] | None) -> None:
    """Stop a process of ours and its process group (server + stubs, or the gateway), politely first."""
    if cmdline is not None and host.process_cmdline(pid) != cmdline:
        return
    for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 5)):
        try:
            os.killpg(pid, sig)  # the server and its stubs (it leads its own session when we started it)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
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


@dataclass(frozen=True)
class Ours:
    """Processes of ours found by what they are (their command lines), whatever the state file says."""

    servers: tuple[int, ...]  # tritonserver processes serving this repository
    stubs: tuple[int, ...]  # Python-backend stubs of this repository's models
    orphans: tuple[int, ...]  # stubs whose tritonserver is gone (they ignore SIGTERM and keep memory)


def find_ours(settings: Settings) -> Ours:
    servers, stubs = [], []
    for pid in host.pids():
        cmd = host.process_cmdline(pid) or []
        if cmd and cmd[0].endswith("/tritonserver") and f"--model-repository={settings.repository}" in cmd:
            servers.append(pid)
        elif len(cmd) > 1 and cmd[0].endswith("triton_python_backend_stub") and cmd[1].startswith(f"{settings.repository}/"):
            stubs.append(pid)
    orphans = [pid for pid in stubs if host.parent_pid(pid) not in servers]
    return Ours(tuple(servers), tuple(stubs), tuple(orphans))


SHM_DIR = Path("/dev/shm")  # noqa: S108 - where Triton's Python backend keeps its regions
SHM_REGION = re.compile(r"^triton_python_backend_shm_region_[0-9a-f-]+$")
SHM_SETUP_S = 2.0  # a region younger than this may belong to a stub that has not mapped it yet


def mapped_files() -> set[str]:
    """Every file some process of this user has mapped (from /proc/<pid>/maps)."""
    mapped = set()
    for pid in host.pids():
        try:
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue
        mapped.update(line.split(None, 5)[5].removesuffix(" (deleted)") for line in lines if line.count(" ") >= 5 and f"{SHM_DIR}/" in line)
    return mapped


def end_orphans(settings: Settings) -> list[str]:
    """Kill the stubs our dead servers left behind (they ignore SIGTERM and keep their memory), then remove
    the Python-backend shared-memory regions of this user that no process maps any more (a dead server's;
    a live server maps its own). Returns what was cleaned, for the log."""
    cleaned = []
    for pid in find_ours(settings).orphans:
        try:
            os.kill(pid, signal.SIGKILL)
            cleaned.append(f"stub {pid}")
        except ProcessLookupError:
            continue
    if cleaned:
        time.sleep(0.5)  # let the killed stubs unmap
    # A starting stub creates its region, then maps it: another server starting beside ours must not lose a region
    # on its way. So the regions are listed before the processes' maps are read, and a young one is left alone.
    now, candidates = time.time(), []
    for path in SHM_DIR.glob("triton_python_backend_shm_region_*"):
        try:
            facts = path.stat()
        except OSError:
            continue
        if facts.st_uid == os.getuid() and SHM_REGION.match(path.name) and now - facts.st_ctime > SHM_SETUP_S:
            candidates.append(path)
    mapped = mapped_files()
    for path in candidates:
        if str(path) not in mapped:
            path.unlink(missing_ok=True)
            cleaned.append(str(path))
    if cleaned:
        log.info("cleaned up after a dead server: %s", ", ".join(cleaned))
    return cleaned


def stop_server(settings: Settings) -> str:
    """Stop our server: the one the state file describes, and any other tritonserver serving this repository
    (a lost or corrupt state file, a changed paths.work); then its orphaned stubs and shared memory."""
    with serving_lock(settings):
        return _stop_server(settings)


def _stop_server(settings: Settings) -> str:
    state = read_state(settings)
    stopped = []
    if state and state.get("boot_id") == host.boot_id() and host.process_cmdline(int(state["pid"])) == state.get("cmdline"):
        terminate(int(state["pid"]), state.get("cmdline"))
        stopped.append(int(state["pid"]))
    for pid in find_ours(settings).servers:
        if pid not in stopped:
            terminate(pid, host.process_cmdline(pid))
            stopped.append(pid)
    settings.state_file.unlink(missing_ok=True)
    cleaned = end_orphans(settings)
    if mps.stop(mps_plan(settings)):
        cleaned.append("CUDA MPS daemon")
    if stopped:
        return f"stopped tritonserver (pid {', '.join(map(str, stopped))})" + (f"; cleaned {len(cleaned)} leftovers" if cleaned else "")
    return "no server of ours is running" + (f"; cleaned {len(cleaned)} leftovers of a dead one" if cleaned else "")


def _failure(settings: Settings, what: str) -> UserError:
    text = settings.log_file.read_text(errors="replace") if settings.log_file.exists() else ""
    lines = relevant_log_lines(text)
    fixes = []
    for pitfall in explain("\n".join(lines) or text):
        fixes.append(f"{pitfall.cause}: {pitfall.fix}")
    detail = "\n  ".join(lines[-10:]) or "(the log is empty)"
    print(f"tritonserver log ({settings.log_file}), relevant lines:\n  {detail}", file=sys.stderr)
    return UserError(f"{what}; see {settings.log_file}", "; ".join(dict.fromkeys(fixes)) or "read the log lines above")


def start_server(
    settings: Settings, install: Installation | None = None, cuda_mps: tuple[mps.Plan, dict[str, str], str] | None = None
) -> dict[str, Any]:
    """Start a server of ours. `cuda_mps`: what ensure_server already proved (_cuda_mps; None: decide here)."""
    install = install or locate_tritonserver()
    plan, mps_env, mps_note = cuda_mps or _cuda_mps(settings, mps_plan(settings))
    if not plan.wanted:
        mps.stop(plan)  # a daemon left from an earlier setting; no server of ours runs at this point
    _check_ports(settings)
    backend_dir = prepare_backend_dir(install, settings.server_dir)
    admin_key = secrets.token_urlsafe(24)
    cmd = server_command(install, settings, backend_dir, admin_key)
    env = server_environment(install)
    client_key = client.create_key()
    restricted = restricted_arguments(admin_key, client_key)
    placeholders, hidden_env = hide_arguments(restricted, build_shim(settings.server_dir), env.get("LD_PRELOAD"))
    assert all(arg in cmd for arg in placeholders)
    env.update(hidden_env)
    settings.server_dir.mkdir(parents=True, exist_ok=True)
    env.update(mps_env)
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
            env=env,
            start_new_session=True,  # outlives snakemake and its process group
            cwd=settings.server_dir,
            umask=0o077,  # the Python backend's /dev/shm regions (requests, responses) and any file it writes: ours only
        )
    state = {
        "pid": process.pid,
        "boot_id": host.boot_id(),
        "cmdline": cmd,
        "admin_key": admin_key,
        "client_key_digest": client.key_digest(client_key, admin_key),  # the key file changed -> restart
        "ports": settings.ports,
        "host": settings.host,
        "repository": settings.repository,
        "models": settings.models,
        "digests": model_digests(settings),
        "origin": install.origin,
        "cuda_mps": {"wanted": plan.wanted, "active": bool(mps_env), "reason": mps_note},
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


def _cuda_mps(settings: Settings, plan: mps.Plan) -> tuple[mps.Plan, dict[str, str], str]:
    """(plan, environment, note): where MPS is wanted, the environment that puts the server under our daemon,
    started (or found running) and proven here; no environment and why not where it is not wanted, or does
    not work and server.cuda_mps is auto."""
    if not plan.wanted:
        return plan, {}, plan.reason
    problem = mps.start(plan)
    if not problem:
        return plan, plan.environment, plan.reason
    if settings.server.cuda_mps == "on":
        raise UserError(f"server.cuda_mps is on, but {problem}", "set server.cuda_mps: auto (serve without MPS) or off")
    log.warning("serving without CUDA MPS: %s", problem)
    return plan, {}, problem


def _failed_models(settings: Settings) -> list[str]:
    """Models whose load failed, from the server log (with --exit-on-error=false the server goes on)."""
    text = settings.log_file.read_text(errors="replace") if settings.log_file.exists() else ""
    return [m for m in settings.models if f"failed to load '{m}'" in text]


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
        failed = _failed_models(settings)
        if failed:  # the others are up: they keep serving, the failure is explained
            serving = [m for m in settings.models if client.model_ready(settings.url(), m)]
            if len(serving) + len(failed) == len(settings.models):
                if not serving:
                    terminate(process.pid, None)
                what = f"model {', '.join(failed)} failed to load" + (f"; {', '.join(serving)} serving" if serving else "")
                raise _failure(settings, what)
        elapsed = time.monotonic() - started
        if elapsed > settings.server.startup_timeout_s:
            terminate(process.pid, None)
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


def reload_models(settings: Settings, state: dict[str, Any], models: tuple[str, ...], broken: tuple[str, ...] = ()) -> list[str]:
    """Load new versions of `models` into the running server (explicit model control; restricted API with
    the admin key from the state file). No unload first: Triton replaces a loaded model only when the new
    version loads, so a failed change leaves the old version serving (tested). `broken` models (a dead stub:
    they serve nothing) are unloaded first, since Triton does not reload an unchanged model. Returns the models
    that loaded; raises after trying all of them if any failed, naming what still serves."""
    headers = {RESTRICTED_KEY_HEADER: state["admin_key"]}
    base = f"http://{settings.url()}/v2"
    loaded, failed = [], []
    for name in models:
        started = time.monotonic()
        if name in broken:
            client.http_post(f"{base}/repository/models/{name}/unload", headers)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while client.model_ready(settings.url(), name) and time.monotonic() < deadline:
                time.sleep(0.2)
        try:
            status, body = client.http_post(f"{base}/repository/models/{name}/load", headers, timeout=settings.server.startup_timeout_s)
        except (TimeoutError, OSError) as err:
            status, body = 0, f"no answer within server.startup_timeout_s = {settings.server.startup_timeout_s} s ({err})"
        if status == 200:
            loaded.append(name)
            log.info("reloaded %s in %.1f s", name, time.monotonic() - started)
            continue
        still = "the previous version keeps serving" if client.model_ready(settings.url(), name) else "it is not serving"
        failed.append(f"{name} ({status}: {body[:300]}; {still})")
    if failed:
        state["digests"] = {**state.get("digests", {}), **{n: d for n, d in model_digests(settings).items() if n in loaded}}
        write_state(settings, state)
        raise _failure(settings, "loading the new version failed for " + "; ".join(failed))
    return loaded


def ensure_server(settings: Settings) -> dict[str, Any]:
    """Keep a current, ready server: start, restart, or reload only the models that changed. Under the
    serving lock: a second caller waits, then finds this one's server and keeps it."""
    with serving_lock(settings):
        return _ensure_server(settings)


def _ensure_server(settings: Settings) -> dict[str, Any]:
    install = locate_tritonserver()
    client.create_key()  # serve makes the client key, once; a server started before a lost key file restarts
    state = read_state(settings)
    facts = observe(settings, state)
    wanted = None
    if state and facts.cmdline_matches:
        backend_dir = prepare_backend_dir(install, settings.server_dir)
        wanted = server_command(install, settings, backend_dir, state.get("admin_key", ""))
    plan = mps_plan(settings)
    decision = decide(state, facts, wanted, plan.wanted)
    log.info("server: %s (%s)", decision.action, decision.reason)
    if decision.action == "reload":
        reload_models(settings, state, decision.models, decision.broken)
        state["digests"] = model_digests(settings)
        write_state(settings, state)
    if decision.action in ("start", "restart"):
        # Servers of ours the state file does not describe (lost or corrupt state) cannot be reloaded
        # without their key: they are replaced too, but only once the new settings are known to work.
        replaced = [int(state["pid"])] if decision.action == "restart" else []
        replaced += [pid for pid in find_ours(settings).servers if pid not in replaced]
        check_can_listen(settings, held_by_replaced=replaced)
        cuda_mps = _cuda_mps(settings, plan)  # proven before anything running is touched
        for pid in replaced:
            log.info("stopping tritonserver pid %d", pid)
            terminate(pid, host.process_cmdline(pid))
        end_orphans(settings)
        state = start_server(settings, install, cuda_mps)
    return {**state, "action": decision.action, "reason": decision.reason}


def server_status(settings: Settings) -> dict[str, Any]:
    state = read_state(settings)
    facts = observe(settings, state)
    # hand edits or deletions in the rendered repository: what runs is not what was rendered
    edited = {name: found for name in settings.models if (found := integrity.problems(Path(settings.repository) / name))}
    status: dict[str, Any] = {
        "running": facts.cmdline_matches,
        "ready": facts.ready,
        "current": bool(state) and state.get("digests") == facts.digests and not facts.dead_stubs and not edited,
        **({"changed_since_rendered": edited} if edited else {}),
        **settings.endpoints,
        "log": str(settings.log_file),
    }
    if state and facts.cmdline_matches:
        status.update(pid=state["pid"], uptime_s=round(time.time() - state["started_at"]), origin=state.get("origin"))
        status["models"] = {name: client.model_ready(settings.url(), name) for name in state.get("models", [])}
        if state.get("cuda_mps", {}).get("wanted"):
            status["cuda_mps"] = "on" if state["cuda_mps"]["active"] else f"wanted, not working: {state['cuda_mps']['reason']}"
    return status


def public_state(state: dict[str, Any]) -> dict[str, Any]:
    """State without secrets, for reports."""
    out = {k: v for k, v in state.items() if k not in ("admin_key", "client_key_digest")}
    if "cmdline" in out:
        out["cmdline"] = redacted_command(out["cmdline"])
    return out
