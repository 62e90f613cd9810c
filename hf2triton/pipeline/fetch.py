"""Step `fetch`: make a model's source files available locally and record exactly what they are.

Hub sources go through huggingface_hub (revision pinned to the resolved commit, token from the
environment, HF_ENDPOINT mirrors, retries with backoff, resumable downloads into a cache under the work
directory). Local directories, .gguf files and files shipped in Python packages are resolved in place.
The record (JSON) lists every file with size and sha256, so a rerun can tell what changed.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import time
from pathlib import Path
from typing import Any

from hf2triton.errors import UserError
from hf2triton.fsutil import atomic_write_json, free_bytes, human_bytes, sha256_file
from hf2triton.pipeline.sources import resolve_local_path
from hf2triton.specs import Source, parse_source

log = logging.getLogger(__name__)

CONFIG_PATTERNS = ["*.json", "*.txt", "*.model", "*.tiktoken", "1_Pooling/*", "tokenizer*"]
WEIGHT_PATTERNS = {
    "safetensors": ["*.safetensors", "*.safetensors.index.json"],
    "bin": ["pytorch_model*.bin", "pytorch_model*.bin.index.json"],
}
DISK_FACTOR = 2.0  # download + the saved pretrained copy
DEFAULT_RETRIES = 5


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def select_hub_files(filenames: list[str], gguf_file: str | None) -> list[str]:
    """The files of a hub repository the pipeline needs: configs, tokenizer, one weight format."""
    if gguf_file:
        if gguf_file not in filenames:
            raise UserError(
                f"gguf_file {gguf_file!r} is not in the repository",
                "pick one of " + ", ".join(f for f in filenames if f.endswith(".gguf")) or "check the name",
            )
        patterns = CONFIG_PATTERNS + [gguf_file]
    else:
        names = set(filenames)
        if any(fnmatch.fnmatch(n, "*.safetensors") for n in names):
            patterns = CONFIG_PATTERNS + WEIGHT_PATTERNS["safetensors"]
        elif any(fnmatch.fnmatch(n, "pytorch_model*.bin") for n in names):
            patterns = CONFIG_PATTERNS + WEIGHT_PATTERNS["bin"]
        elif any(n.endswith(".gguf") for n in names):
            raise UserError("the repository holds only GGUF weights", "set gguf_file: to one of its .gguf files")
        else:
            raise UserError("the repository has no safetensors or PyTorch weights", "choose a transformers model repository")
    return sorted(n for n in filenames if any(fnmatch.fnmatch(n, p) for p in patterns))


def _retryable(err: Exception) -> bool:
    import requests
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    if isinstance(err, (requests.ConnectionError, requests.Timeout, LocalEntryNotFoundError, TimeoutError, ConnectionError)):
        return True
    if isinstance(err, HfHubHTTPError) and err.response is not None:
        return err.response.status_code in (408, 429) or err.response.status_code >= 500
    return False


def explain_hub_error(err: Exception, repo_id: str, revision: str) -> UserError:
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    auth_hint = "if it is private or gated, export HF_TOKEN=<your token> (never put tokens in config.yaml)"
    if isinstance(err, GatedRepoError):
        return UserError(f"hub repository {repo_id!r} is gated", "accept its terms on the hub, then " + auth_hint)
    if isinstance(err, RevisionNotFoundError):
        return UserError(f"revision {revision!r} not found in {repo_id!r}", "use an existing branch, tag or commit hash")
    if isinstance(err, RepositoryNotFoundError):
        return UserError(f"hub repository {repo_id!r} not found at {hub_endpoint()} (or not accessible)", f"check the id; {auth_hint}")
    if isinstance(err, EntryNotFoundError):
        return UserError(f"a file of {repo_id!r}@{revision} is missing on the hub: {err}", "check gguf_file / the revision")
    return UserError(
        f"hub unreachable at {hub_endpoint()} for {repo_id!r}: {type(err).__name__}: {str(err).splitlines()[0][:200]}",
        "check the network, or set HF_ENDPOINT to a reachable mirror; for offline use a local source",
    )


def with_retries(action, what: str, attempts: int | None = None, first_delay_s: float = 1.0):
    """Run `action()`; retry transient network failures with exponential backoff."""
    attempts = attempts or int(os.environ.get("HF2TRITON_FETCH_RETRIES", DEFAULT_RETRIES))
    delay = float(os.environ.get("HF2TRITON_FETCH_BACKOFF_S", first_delay_s))
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as err:  # noqa: BLE001 - classified below
            if not _retryable(err) or attempt == attempts:
                raise
            log.warning("%s failed (%s: %s); retry %d/%d in %.0f s", what, type(err).__name__, str(err)[:120], attempt, attempts - 1, delay)
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def fetch_hub(repo_id: str, revision: str, gguf_file: str | None, cache_dir: Path) -> dict[str, Any]:
    from huggingface_hub import HfApi, snapshot_download

    api = HfApi(endpoint=hub_endpoint())
    log.info("resolving %s@%s on %s", repo_id, revision, hub_endpoint())
    try:
        info = with_retries(lambda: api.model_info(repo_id, revision=revision, files_metadata=True), f"model_info {repo_id}")
    except Exception as err:  # noqa: BLE001 - every failure is explained below
        raise explain_hub_error(err, repo_id, revision) from None
    sizes = {s.rfilename: (s.size or 0) for s in info.siblings or []}
    wanted = select_hub_files(list(sizes), gguf_file)
    total = sum(sizes[name] for name in wanted)
    need = int(total * DISK_FACTOR)
    free = free_bytes(cache_dir)
    if free < need:
        raise UserError(
            f"not enough disk for {repo_id}: needs {human_bytes(need)} (2x its {human_bytes(total)}), "
            f"{human_bytes(free)} free at {cache_dir}",
            "free space, or point paths.work at a larger disk",
        )
    log.info("downloading %d files (%s) of %s at commit %s", len(wanted), human_bytes(total), repo_id, info.sha)
    try:
        local = with_retries(
            lambda: snapshot_download(repo_id, revision=info.sha, cache_dir=str(cache_dir), allow_patterns=wanted, endpoint=hub_endpoint()),
            f"download {repo_id}",
        )
    except Exception as err:  # noqa: BLE001 - every failure is explained below
        raise explain_hub_error(err, repo_id, revision) from None
    return {"path": str(Path(local).resolve()), "resolved_revision": info.sha, "gguf_file": gguf_file}


def fetch_local(source: Source, gguf_file: str | None, where: str) -> dict[str, Any]:
    path = resolve_local_path(source, where)
    if path.is_file():
        if path.suffix != ".gguf":
            raise UserError(f"{where}: {path} is a file but not .gguf", "point at a model directory or a .gguf file")
        return {"path": str(path.parent), "gguf_file": path.name, "resolved_revision": None}
    if gguf_file and not (path / gguf_file).is_file():
        raise UserError(f"{where}: {gguf_file} not found in {path}", "check gguf_file")
    if not gguf_file and not (path / "config.json").is_file():
        raise UserError(f"{where}: {path} has no config.json", "point at a transformers model directory (save_pretrained output)")
    return {"path": str(path), "gguf_file": gguf_file, "resolved_revision": None}


def describe_files(root: Path, gguf_file: str | None) -> dict[str, dict[str, Any]]:
    """size + sha256 of the files the model is made of (a GGUF source: just that file)."""
    files = [root / gguf_file] if gguf_file else sorted(p for p in root.rglob("*") if p.is_file() and ".cache" not in p.parts)
    return {str(p.relative_to(root)): {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in files}


def fetch_step(source: str, revision: str, gguf_file: str | None, cache_dir: str, output: str) -> dict[str, Any]:
    """Fetch/resolve `source` and write the record to `output`."""
    where = "source"
    parsed = parse_source(source, where)
    if parsed.is_hub:
        record = fetch_hub(parsed.value, revision, gguf_file, Path(cache_dir))
    else:
        record = fetch_local(parsed, gguf_file, where)
    record.update(source=source, kind=parsed.kind, revision=revision if parsed.is_hub else None)
    record["files"] = describe_files(Path(record["path"]), record["gguf_file"])
    record["total_bytes"] = sum(f["size"] for f in record["files"].values())
    atomic_write_json(output, record)
    log.info("fetched %s: %d files, %s", source, len(record["files"]), human_bytes(record["total_bytes"]))
    return record
