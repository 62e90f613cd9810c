"""The server's state file (pid, boot id, command line, admin key, digests of what it loads), what is observed
now about the server it describes, and the decision: keep, start, restart or reload.

The state file is deliberately not a rule output: every `serve` checks the real process against it
(observe) and decides (decide: pure) what to do with the server.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf2triton import host
from hf2triton.errors import UserError
from hf2triton.fsutil import atomic_write_json
from hf2triton.triton import client
from hf2triton.triton.modelconfig import instance_count, model_parameters, read_model_config_or_none
from hf2triton.triton.settings import Settings, redacted_command


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


def record_loaded(settings: Settings, state: dict[str, Any], names: list[str] | tuple[str, ...]) -> None:
    """Into `state`: what the server has just loaded for `names`, from the rendered repository (their digests, and
    their instance counts: the stubs to expect). A later render (a tuning overlay, a config whose validation then
    fails) changes the files, not what runs."""
    digests = model_digests(settings)
    state["digests"] = {**state.get("digests", {}), **{name: digests[name] for name in names}}
    state["instances"] = {**state.get("instances", {}), **{name: expected_instances(settings, name) for name in names}}


def dead_stub_models(settings: Settings, state: dict[str, Any]) -> list[str]:
    """Models of the server `state` describes with fewer live Python-backend stub processes than the instances it
    loaded. A killed stub leaves the model "ready" while every request fails with 'Stub process ... is not healthy'."""
    cmdlines = [host.process_cmdline(pid) or [] for pid in host.descendants(int(state["pid"]))]
    loaded = state.get("instances", {})
    dead = []
    for name in settings.models:
        marker = f"{settings.repository}/{name}/"
        alive = sum(1 for cmd in cmdlines if len(cmd) > 1 and "triton_python_backend_stub" in cmd[0] and cmd[1].startswith(marker))
        # a state written before instance counts were recorded: the rendered file's
        if alive < (loaded[name] if name in loaded else expected_instances(settings, name)):
            dead.append(name)
    return dead


def _model_dir_of(config_path: Path) -> Path:
    config = read_model_config_or_none(config_path)
    return Path((model_parameters(config).model_dir if config else "") or "/nonexistent")


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
        alive = bool(cmdline)  # a zombie (killed, its parent not yet waiting) has an empty command line: gone
        matches = alive and cmdline == state.get("cmdline")
        ready = matches and is_ready(settings)
        live = ready or (matches and client.is_live(settings.url()))
        if live and not ready:
            not_ready = [name for name in settings.models if not client.model_ready(settings.url(), name)]
    dead = dead_stub_models(settings, state) if live and state else []
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


def public_state(state: dict[str, Any]) -> dict[str, Any]:
    """State without secrets, for reports."""
    out = {k: v for k, v in state.items() if k not in ("admin_key", "client_key_digest")}
    if "cmdline" in out:
        out["cmdline"] = redacted_command(out["cmdline"])
    return out
