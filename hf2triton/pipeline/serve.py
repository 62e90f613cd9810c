"""Targets `serve`, `status` and `stop`: the long-lived server, driven through hf2triton.triton.process."""

from __future__ import annotations

import json
import sys
from typing import Any

from hf2triton.errors import UserError
from hf2triton.specs import ServerSpec, from_param
from hf2triton.triton.process import Settings, ensure_server, server_status, stop_server


def settings_from_params(server: dict[str, Any], models: list[str], work: str, repository: str) -> Settings:
    """Settings from a rule's params (the server spec travels as a dict: see hf2triton.specs.to_param)."""
    return Settings.of(from_param(ServerSpec, server), models, work, repository)


def serve_step(server: dict[str, Any], models: list[str], work: str, repository: str) -> dict[str, Any]:
    """Target `serve`: ensure the server is up and current, then say where and what it serves."""
    settings = settings_from_params(server, models, work, repository)
    state = ensure_server(settings)
    status = server_status(settings)
    not_ready = [name for name, ok in status.get("models", {}).items() if not ok]
    if not_ready:
        raise UserError(f"models not ready: {', '.join(not_ready)}", f"read {settings.log_file}; run `make status`")
    print(
        f"hf2triton: serving {', '.join(models)} at {status['http']} (HTTP), {status['grpc']} (gRPC), "
        f"{status['metrics']}; server {state['action']} ({state['reason']}); stop with `make stop`",
        file=sys.stderr,
    )
    return status


def status_step(server: dict[str, Any], models: list[str], work: str, repository: str) -> dict[str, Any]:
    status = server_status(settings_from_params(server, models, work, repository))
    print(json.dumps(status, indent=2))
    return status


def stop_step(server: dict[str, Any], models: list[str], work: str, repository: str) -> str:
    message = stop_server(settings_from_params(server, models, work, repository))
    print(f"hf2triton: {message}", file=sys.stderr)
    return message
