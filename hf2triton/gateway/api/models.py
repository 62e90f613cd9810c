"""GET /v1/models (the served models), /v1/status (hf2triton's own: backends, devices, the last validation) and
/health (the gateway is up and Triton is ready; no key, for probes)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from hf2triton.gateway import protocol
from hf2triton.gateway.backend import gateway_of
from hf2triton.gateway.boundary import KEY
from hf2triton.gateway.errors import not_served
from hf2triton.gateway.process import VALIDATION_REPORT_ENV

router = APIRouter()


def validation_summary() -> dict[str, Any] | None:
    """The last validation (report.json that `make serve` points $HF2TRITON_VALIDATION_REPORT at): pass/fail, when,
    and each model's result; None without one."""
    path = os.environ.get(VALIDATION_REPORT_ENV)
    if not path:
        return None
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    models = {name: bool(model.get("ok")) for name, model in (report.get("models") or {}).items()}
    finished = report.get("finished_at")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(finished)) if isinstance(finished, (int, float)) else ""
    return {"ok": bool(report.get("ok")), "time": when, "models": models}


@router.get("/health")
async def health(request: Request):
    try:  # no waiting: a probe wants an answer now (an unreachable Triton gets one fresh channel at once)
        ready = await gateway_of(request).call(lambda triton: triton.is_server_ready(), patience_s=0)
    except Exception:  # noqa: BLE001 - not ready
        ready = False
    return JSONResponse({"gateway": "up", "triton_ready": ready}, status_code=200 if ready else 503)


@router.get("/v1/status", dependencies=KEY)
async def status(request: Request):
    """hf2triton's own: the served models with backend, device and instances, Triton's readiness and the last
    validation result (what the playground's Status view shows)."""
    gateway = gateway_of(request)
    await gateway.refresh()
    models = [protocol.model_status(m) for m in gateway.models.values()]
    return {"triton_ready": True, "models": models, "validation": validation_summary()}


@router.get("/v1/models", dependencies=KEY)
async def models(request: Request):
    gateway = gateway_of(request)
    await gateway.refresh()  # 503 while Triton is down: an empty list would read as "nothing is served"
    return {"object": "list", "data": [protocol.model_card(m, gateway.created) for m in gateway.models.values()]}


@router.get("/v1/models/{model_id}", dependencies=KEY)
async def model(request: Request, model_id: str):
    """One model's card (the OpenAI SDK's models.retrieve); 404 in OpenAI's words for a name not served here."""
    gateway = gateway_of(request)
    await gateway.refresh()
    served = gateway.models.get(model_id)
    if served is None:
        raise not_served(model_id)
    return protocol.model_card(served, gateway.created)
