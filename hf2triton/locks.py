"""Recover from a killed Snakemake run: its lock files stay behind and block every later run
("Directory cannot be locked"). If no Snakemake process is working in this directory any more, the
locks are stale and can go (what `snakemake --unlock` does, but automatic and only when safe)."""

from __future__ import annotations

import os
from pathlib import Path

from hf2triton import host


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
