"""Locks. Snakemake's: a killed run leaves its lock files behind and they block every later run ("Directory
cannot be locked"); if no Snakemake process works in this directory any more they are stale and can go (what
`snakemake --unlock` does, but automatic and only when safe). Ours: `exclusive`, one holder at a time of what a
file guards (the server directory: one start or stop at a time)."""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hf2triton import host
from hf2triton.errors import UserError

log = logging.getLogger(__name__)
_held = threading.local()  # per thread: lock file -> depth (re-entrant: serve holds it around ensure_server, which takes it too)


def _ancestors(pid: int | None) -> set[int]:
    seen: set[int] = set()
    while pid is not None and pid > 1 and pid not in seen:
        seen.add(pid)
        pid = host.parent_pid(pid)
    return seen


def snakemake_running_in(workdir: Path) -> bool:
    """Another snakemake process (not us or our parents) whose working directory is `workdir`."""
    workdir = workdir.resolve()
    mine = _ancestors(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        cmdline = host.process_cmdline(int(entry.name)) or []
        if not any("snakemake" in part for part in cmdline[:3]):
            continue
        try:
            if Path(os.readlink(entry / "cwd")).resolve() == workdir:
                return True
        except OSError:
            continue
    return False


def clear_stale_locks(workdir: Path | str) -> list[str]:
    """Remove lock files of killed runs; returns what was removed (nothing if a run is alive)."""
    locks = Path(workdir) / ".snakemake" / "locks"
    files = sorted(locks.glob("*.lock")) if locks.is_dir() else []
    if not files or snakemake_running_in(Path(workdir)):
        return []
    for path in files:
        path.unlink(missing_ok=True)
    return [p.name for p in files]


@contextmanager
def exclusive(path: Path, timeout_s: float, what: str) -> Iterator[None]:
    """Hold an exclusive flock on `path` (one holder across processes and threads; re-entrant within a thread).
    flock, not a pid file: the kernel releases it when the holder dies, so a crash never leaves it stuck.
    Waits at most `timeout_s`, then a UserError naming the holder."""
    key = str(path.resolve())
    depth: dict[str, int] = _held.__dict__.setdefault("depth", {})
    if depth.get(key):
        depth[key] += 1
        try:
            yield
        finally:
            depth[key] -= 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # its own open file: flock then excludes other threads too
    try:
        deadline, told = time.monotonic() + timeout_s, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                if time.monotonic() >= deadline:
                    raise UserError(
                        f"{what}: another hf2triton run (pid {holder}) still holds {path} after {timeout_s:.0f} s",
                        "wait for that run to finish (or stop it), then run again",
                    ) from None
                if not told:
                    log.info("waiting for another hf2triton run (pid %s): %s", holder, what)
                    told = True
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # who holds it, for the waiters' messages
        depth[key] = 1
        try:
            yield
        finally:
            del depth[key]
    finally:
        os.close(fd)  # releases the lock
