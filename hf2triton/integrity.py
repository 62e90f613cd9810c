"""What was built is what gets served: file manifests written when an artifact is built, checked before
every run (cheap first: size and mtime; a full hash only for files whose stat changed).

A rendered model directory or a saved model that no longer matches its manifest (a deleted model.py, a hand
edit, a truncated safetensors file) is rebuilt: `rules/common.smk` adds the artifacts `damaged()` names to
the DAG's forced files, so the dry run lists the rebuild ("Forced execution"), and nothing is deleted first.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from hf2triton.fsutil import sha256_file

log = logging.getLogger(__name__)

MANIFEST = ".hf2triton-files.json"
SNAKEMAKE_STAMP = ".snakemake_timestamp"  # Snakemake's own marker in directory outputs
NOT_CONTENT = (MANIFEST, SNAKEMAKE_STAMP)


def describe(root: Path | str, skip: tuple[str, ...] = NOT_CONTENT) -> dict[str, dict[str, Any]]:
    """{relative path: {size, mtime_ns, sha256}} of every file below `root`."""
    root = Path(root)
    files = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if path.is_file() and relative not in skip and "__pycache__" not in path.parts:
            stat = path.stat()
            files[relative] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256_file(path)}
    return files


def write_manifest(root: Path | str) -> dict[str, dict[str, Any]]:
    """Record the files of a freshly built artifact (called last, inside its atomic build directory)."""
    files = describe(root)
    (Path(root) / MANIFEST).write_text(json.dumps({"files": files}, indent=1) + "\n")
    return files


def problems(root: Path | str) -> list[str]:
    """What changed since the manifest was written: missing, added, or altered files. An artifact built
    before manifests existed (no manifest) is taken as it is."""
    root = Path(root)
    manifest_path = root / MANIFEST
    if not root.is_dir() or not manifest_path.is_file():
        return []
    try:
        recorded: dict[str, dict[str, Any]] = json.loads(manifest_path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return [f"{MANIFEST} is unreadable"]
    found = []
    for relative, expected in recorded.items():
        path = root / relative
        try:
            stat = path.stat()
        except OSError:
            found.append(f"{relative} is missing")
            continue
        if stat.st_size != expected["size"]:
            found.append(f"{relative} changed size ({expected['size']} -> {stat.st_size} bytes)")
        elif stat.st_mtime_ns != expected["mtime_ns"] and sha256_file(path) != expected["sha256"]:
            found.append(f"{relative} was modified")
    extra = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and p.name not in NOT_CONTENT and "__pycache__" not in p.parts and p.relative_to(root).as_posix() not in recorded
    )
    found += [f"{relative} was added" for relative in extra]
    return found


def damaged(artifacts: dict[str, str]) -> dict[str, list[str]]:
    """{path: problems} for the artifacts (label -> directory) that no longer match their manifests."""
    out = {}
    for path in artifacts.values():
        found = problems(path)
        if found:
            out[path] = found
    return out
