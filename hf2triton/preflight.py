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
from hf2triton.server import Settings, locate_tritonserver, observe, read_state, settings_from_config
from hf2triton.sources import parse_source, resolve_local_path

log = logging.getLogger("hf2triton.preflight")

INSTANCE_OVERHEAD_BYTES = 450 * 1024**2  # a Python stub with torch + transformers imported
GGUF_EXPANSION = 7.5  # Q4 GGUF -> float32 weights
BYTES_PER_PARAM = {"float32": 4, "float16": 2, "bfloat16": 2}


def _check(name: str, ok: bool, detail: str, fix: str = "") -> dict[str, Any]:
    return {"name": name, "ok": ok, "detail": detail, "fix": fix}


def source_bytes(model: dict) -> int | None:
    """Size of a local/package source on disk (None for hub sources: known only when fetching)."""
    source = parse_source(model["source"])
    if source.is_hub:
        return None
    try:
        return tree_size(resolve_local_path(source))
    except UserError:
        return None


def estimate_model_memory(model: dict, pretrained_dir: Path, gpu: bool) -> int | None:
    """Bytes one instance needs: weights at the serving dtype plus the stub's own overhead."""
    manifest = pretrained_dir / "hf2triton.json"
    dtype = model["dtype"] if model["dtype"] != "auto" else ("float16" if gpu else "float32")
    if manifest.is_file():
        params = json.loads(manifest.read_text())["parameters"]
        weights = params * BYTES_PER_PARAM[dtype]
    else:
        size = source_bytes(model)
        if size is None:
            return None
        weights = int(size * (GGUF_EXPANSION if model["source"].endswith(".gguf") else 1.0))
        weights = weights * BYTES_PER_PARAM[dtype] // 4
    return weights + INSTANCE_OVERHEAD_BYTES


def run_preflight(cfg: dict, pretrained_dirs: dict[str, str], gpu_available: bool, output: str) -> dict[str, Any]:
    settings: Settings = settings_from_config(cfg)
    checks = []
    try:
        install = locate_tritonserver()
        checks.append(_check("tritonserver", True, f"{install.binary} ({install.origin})"))
    except UserError as err:
        checks.append(_check("tritonserver", False, err.message, err.fix or ""))

    checks.append(_check("gpu", True, "NVIDIA GPU present" if gpu_available else "no GPU: models with device auto run on CPU"))
    for model in cfg["models"]:
        if model["device"] == "gpu" and not gpu_available:
            checks.append(_check(f"device:{model['name']}", False, "device: gpu but this host has no GPU", "set device: auto or cpu"))

    pending = [m for m in cfg["models"] if not (Path(pretrained_dirs[m["name"]]) / "hf2triton.json").is_file()]
    need = sum(int(2 * (source_bytes(m) or 0) * (GGUF_EXPANSION if m["source"].endswith(".gguf") else 1)) for m in pending)
    free = free_bytes(cfg["paths"]["work"])
    checks.append(
        _check(
            "disk",
            free >= need,
            f"{human_bytes(free)} free at {cfg['paths']['work']}, {human_bytes(need)} needed for {len(pending)} model(s) still to build"
            + (" (hub sources are checked when fetched)" if any(parse_source(m["source"]).is_hub for m in pending) else ""),
            "free space or point paths.work at a larger disk",
        )
    )

    state = read_state(settings)
    ours = observe(settings, state).cmdline_matches if state else False
    for key, port in settings.ports.items():
        held_by_us = ours and state.get("ports", {}).get(key) == port and state.get("host") == settings.host
        free_now = host.port_is_free(settings.host, port)
        checks.append(
            _check(
                f"port:{key}",
                free_now or held_by_us,
                f"{settings.host}:{port} "
                + ("free" if free_now else "held by our tritonserver" if held_by_us else "in use by another program"),
                f"stop that program or set server.{key} in config.yaml to a free port",
            )
        )

    on_gpu = {m["name"]: gpu_available and m["device"] != "cpu" for m in cfg["models"]}
    estimates = {m["name"]: estimate_model_memory(m, Path(pretrained_dirs[m["name"]]), on_gpu[m["name"]]) for m in cfg["models"]}
    per_model = "".join(f"; {n}: {human_bytes(e)}/instance" for n, e in estimates.items() if e)
    ram_need = sum((estimates[m["name"]] or 0) * m["instances"] for m in cfg["models"])
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
    gpu_need = sum((estimates[m["name"]] or 0) * m["instances"] for m in cfg["models"] if on_gpu[m["name"]])
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
        shm_need = settings.shm_default_byte_size * sum(m["instances"] for m in cfg["models"]) * 2
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
