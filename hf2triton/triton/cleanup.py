"""Processes of ours found by what they are (their command lines, whatever the state file says), stopped
politely first (terminate), and what a dead server leaves behind: orphaned Python-backend stubs and their
/dev/shm regions. Servers and supervisors are found by the repository they serve, which every config of a project
shares: so also those of another work directory (paths.work)."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf2triton import host
from hf2triton.triton.settings import Settings, settings_of_spec

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30  # SIGTERM, then SIGKILL after this long (and how long a reload waits for an unload)


def terminate(pid: int, cmdline: list[str] | None) -> None:
    """Stop a process of ours and its process group (server + stubs, or the gateway), politely first."""
    if cmdline is not None and host.process_cmdline(pid) != cmdline:
        return

    def send(sig: int) -> None:
        try:
            os.killpg(pid, sig)  # the server and its stubs (it leads its own session when we started it)
        except (ProcessLookupError, PermissionError):
            os.kill(pid, sig)

    _stop(send, lambda: _reaped(pid) or host.process_gone(pid))  # a zombie is gone: only its parent's wait ends it


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (zombies do not count)."""
    return [pid for pid in host.pids() if host.process_group(pid) == pgid and not host.process_gone(pid)]


def terminate_group(pgid: int) -> None:
    """Stop every process of a process group of ours, politely first, also when its leader is gone (the gateway's
    uvicorn workers outlive it, and keep its port). The caller proves the group is ours: its leader alive with our
    command line, or gone while members remain (a pid is not reused while a process group of that id exists)."""

    def ended() -> bool:
        _reaped(pgid)  # the leader, where it is our child: a zombie until waited for
        return not group_members(pgid)

    _stop(lambda sig: os.killpg(pgid, sig), ended)


def _reaped(pid: int) -> bool:
    """Waits for `pid` if it is a child of ours that has ended (else it stays a zombie); True when it was."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return False


def _stop(send: Callable[[int], None], ended: Callable[[], bool]) -> None:
    """SIGTERM, then SIGKILL after STOP_TIMEOUT_S, until `ended`."""
    for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 5)):
        try:
            send(sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if ended():
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


def process_cwd(pid: int) -> Path | None:
    """The working directory of `pid` (a tritonserver of ours runs in its work directory's server directory)."""
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


SUPERVISOR_MODULE = "hf2triton.triton.supervisor"  # `python -m hf2triton.triton.supervisor <spec file>`


@dataclass(frozen=True)
class SupervisorProcess:
    """A running supervisor of ours, found by its command line, and the settings its spec file names."""

    pid: int
    cmdline: list[str]
    settings: Settings

    def __str__(self) -> str:
        return f"the supervisor of {self.settings.work} (pid {self.pid})"


def find_supervisors(repository: str) -> list[SupervisorProcess]:
    """Supervisors serving `repository`, whatever their work directory: its spec file (the command line names it)
    says which repository, relative to the directory the supervisor runs in. One whose spec file is gone or
    unreadable cannot be told apart (and exits by itself: its server's state is gone with it)."""
    found = []
    for pid in host.pids():
        cmd = host.process_cmdline(pid) or []
        if len(cmd) != 4 or cmd[1:3] != ["-m", SUPERVISOR_MODULE]:
            continue
        try:
            spec: dict[str, Any] = json.loads(Path(cmd[3]).read_text())
            settings = settings_of_spec(spec, process_cwd(pid) or "/nonexistent")
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if settings.repository == str(Path(repository).resolve()):
            found.append(SupervisorProcess(pid, cmd, settings))
    return found


def stop_supervisors(repository: str, unless_work: str | None = None) -> list[SupervisorProcess]:
    """Stop the supervisors serving `repository` (but those of work directory `unless_work`, and this process);
    returns those stopped (their settings name the work directories whose gateways are left)."""
    stopped = []
    for found in find_supervisors(repository):
        if found.settings.work != unless_work and found.pid != os.getpid():
            terminate(found.pid, found.cmdline)
            stopped.append(found)
    return stopped


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
