"""Step `preflight`: cheap checks of the host before any expensive work (runs first: highest priority).

Python-backend stub for this Python, free disk for models still to be built, GPU presence against
`device:`, ports free or held by our own server, estimated memory of all model instances.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from hf2triton import host
from hf2triton.errors import UserError
from hf2triton.fsutil import atomic_write_json, free_bytes, human_bytes, tree_size
from hf2triton.pipeline.sources import parse_source, resolve_local_path
from hf2triton.specs import Footprint, ServerSpec, from_param
from hf2triton.triton.install import locate_tritonserver
from hf2triton.triton.process import Settings, find_ours, listening_ports, observe, read_state

log = logging.getLogger(__name__)

INSTANCE_OVERHEAD_BYTES = 450 * 1024**2  # a Python stub with torch + transformers imported
GGUF_EXPANSION = 7.5  # Q4 GGUF -> float32 weights
BYTES_PER_PARAM = {"float32": 4, "float16": 2, "bfloat16": 2}


def instance_bytes(models: list[Footprint], estimates: dict[str, int | None]) -> int:
    """Estimated bytes of every instance of `models`."""
    return sum((estimates[m.name] or 0) * m.instances for m in models)


def _check(name: str, ok: bool, detail: str, fix: str = "") -> dict[str, Any]:
    return {"name": name, "ok": ok, "detail": detail, "fix": fix}


def source_bytes(model: Footprint) -> int | None:
    """Size of a local/package source on disk (None for hub sources: known only when fetching)."""
    source = parse_source(model.source)
    if source.is_hub:
        return None
    try:
        return tree_size(resolve_local_path(source))
    except UserError:
        return None


def source_expansion(model: Footprint) -> float:
    """Bytes of float32 weights per byte of source (a Q4 GGUF expands when loaded)."""
    return GGUF_EXPANSION if model.source.endswith(".gguf") else 1.0


def estimate_model_memory(model: Footprint, pretrained_dir: Path, gpu: bool) -> int | None:
    """Bytes one instance needs: weights at the serving dtype plus the stub's own overhead."""
    manifest = pretrained_dir / "hf2triton.json"
    dtype = model.dtype if model.dtype != "auto" else ("float16" if gpu else "float32")
    if manifest.is_file():
        params = json.loads(manifest.read_text())["parameters"]
        weights = params * BYTES_PER_PARAM[dtype]
    else:
        size = source_bytes(model)
        if size is None:
            return None
        weights = int(size * source_expansion(model))
        weights = weights * BYTES_PER_PARAM[dtype] // 4
    return weights + INSTANCE_OVERHEAD_BYTES


def preflight_step(
    models: list[dict[str, Any]], server: dict[str, Any], work: str, pretrained_dirs: dict[str, str], gpu_available: bool, output: str
) -> dict[str, Any]:
    """Rule `preflight` (specs arrive as params dicts)."""
    footprints = [from_param(Footprint, m) for m in models]
    settings = Settings.of(from_param(ServerSpec, server), [m.name for m in footprints], work)
    return run_preflight(footprints, settings, work, pretrained_dirs, gpu_available, output)


def run_preflight(
    models: list[Footprint], settings: Settings, work: str, pretrained_dirs: dict[str, str], gpu_available: bool, output: str
) -> dict[str, Any]:
    """The checks; `work` is paths.work as configured (named in messages)."""
    checks = []
    try:
        install = locate_tritonserver()
        checks.append(_check("tritonserver", True, f"{install.binary} ({install.origin})"))
    except UserError as err:
        checks.append(_check("tritonserver", False, err.message, err.fix or ""))

    checks.append(_check("gpu", True, "NVIDIA GPU present" if gpu_available else "no GPU: models with device auto run on CPU"))
    for model in models:
        if model.device == "gpu" and not gpu_available:
            checks.append(_check(f"device:{model.name}", False, "device: gpu but this host has no GPU", "set device: auto or cpu"))

    pending = [m for m in models if not (Path(pretrained_dirs[m.name]) / "hf2triton.json").is_file()]
    need = sum(int(2 * (source_bytes(m) or 0) * source_expansion(m)) for m in pending)
    free = free_bytes(work)
    checks.append(
        _check(
            "disk",
            free >= need,
            f"{human_bytes(free)} free at {work}, {human_bytes(need)} needed for {len(pending)} model(s) still to build"
            + (" (hub sources are checked when fetched)" if any(parse_source(m.source).is_hub for m in pending) else ""),
            "free space or point paths.work at a larger disk",
        )
    )

    state = read_state(settings)
    ours = observe(settings, state).cmdline_matches if state else False
    # our servers, found by their command lines too (a lost or corrupt state file, a changed paths.work)
    our_servers = find_ours(settings).servers
    our_ports = set().union(*(listening_ports(pid) for pid in our_servers)) if our_servers else set()
    for key, port in settings.ports.items():
        held_by_us = port in our_ports
        free_now = host.port_is_free(settings.server.host, port)
        checks.append(
            _check(
                f"port:{key}",
                free_now or held_by_us,
                f"{settings.server.host}:{port} "
                + ("free" if free_now else "held by our tritonserver" if held_by_us else "in use by another program"),
                f"stop that program or set server.{key} in config.yaml to a free port",
            )
        )

    on_gpu = {m.name: gpu_available and m.device != "cpu" for m in models}
    estimates = {m.name: estimate_model_memory(m, Path(pretrained_dirs[m.name]), on_gpu[m.name]) for m in models}
    per_model = "".join(f"; {n}: {human_bytes(e)}/instance" for n, e in estimates.items() if e)
    ram_need = instance_bytes(models, estimates)
    available = host.available_memory_bytes()
    if ours:
        available += host.process_rss_bytes(int(state["pid"])) or 0  # freed if the server restarts
    checks.append(
        _check(
            "memory",
            ram_need <= available,
            f"estimated {human_bytes(ram_need)} for all instances, {human_bytes(available)} available{per_model}",
            "fewer instances, a smaller dtype, or fewer models",
        )
    )
    gpu_need = instance_bytes([m for m in models if on_gpu[m.name]], estimates)
    gpu_free = host.gpu_free_memory_bytes() if gpu_need else None
    if gpu_free is not None:
        checks.append(
            _check(
                "gpu-memory",
                gpu_need <= gpu_free,
                f"estimated {human_bytes(gpu_need)} on GPU 0, {human_bytes(gpu_free)} free",
                "fewer GPU instances, float16, or device: cpu for some models",
            )
        )
    shm = Path("/dev/shm")  # noqa: S108 - only measured
    if shm.is_dir():
        shm_free = shutil.disk_usage(shm).free
        shm_need = settings.server.shm_default_byte_size * sum(m.instances for m in models) * 2
        checks.append(
            _check(
                "shared-memory",
                shm_free >= shm_need,
                f"{shm}: {human_bytes(shm_free)} free, {human_bytes(shm_need)} needed",
                "free /dev/shm or lower server.shm_default_byte_size",
            )
        )
    report = {"ok": all(c["ok"] for c in checks), "checks": checks}
    for check in checks:
        (log.info if check["ok"] else log.error)("preflight %-22s %s  %s", check["name"], "ok " if check["ok"] else "FAIL", check["detail"])
    if not report["ok"]:
        failed = [c for c in checks if not c["ok"]]
        raise UserError(
            "preflight failed: " + "; ".join(f"{c['name']}: {c['detail']}" for c in failed),
            "; ".join(dict.fromkeys(c["fix"] for c in failed)),
        )
    atomic_write_json(output, report)
    return report
