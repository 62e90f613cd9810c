"""Launch, watch, reload and stop a standalone tritonserver (no Docker): keep a current, ready server (start,
restart, or reload only the models that changed), under one lock per work directory. One server serves a repository:
a run of another work directory (paths.work, another config) replaces it, and stops that directory's supervisor first.

The server outlives Snakemake. What it is configured as: triton.settings; its state file and the restart
decision: triton.state; its ports: triton.ports; finding and stopping processes of ours, and what dead ones
leave behind: triton.cleanup.
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hf2triton import host, integrity
from hf2triton.errors import UserError
from hf2triton.gateway.process import stop_gateway
from hf2triton.logs import rotate
from hf2triton.triton import client, mps
from hf2triton.triton.cleanup import STOP_TIMEOUT_S, end_orphans, find_ours, process_cwd, stop_supervisors, terminate
from hf2triton.triton.hidden_args import build_shim, hide_arguments
from hf2triton.triton.install import Installation, locate_tritonserver, prepare_backend_dir, server_environment
from hf2triton.triton.modelconfig import instance_count, read_model_config_or_none, uses_gpu
from hf2triton.triton.pitfalls import explain, relevant_log_lines
from hf2triton.triton.ports import check_can_listen, check_ports_free
from hf2triton.triton.settings import RESTRICTED_KEY_HEADER, Settings, restricted_arguments, server_command, serving_lock
from hf2triton.triton.state import decide, is_ready, observe, read_state, record_loaded, write_state

log = logging.getLogger(__name__)


def gpu_processes(settings: Settings) -> int:
    """How many stub processes of the rendered models run on the GPU (each has its own CUDA context)."""
    configs = [read_model_config_or_none(Path(settings.repository) / name / "config.pbtxt") for name in settings.models]
    return sum(instance_count(config) for config in configs if config is not None and uses_gpu(config))


def mps_plan(settings: Settings) -> mps.Plan:
    return mps.plan(settings.server.cuda_mps, gpu_processes(settings), settings.server_dir)


def stop_server(settings: Settings) -> str:
    """Stop our server: the one the state file describes, and any other tritonserver serving this repository
    (a lost or corrupt state file, a changed paths.work); then its orphaned stubs and shared memory."""
    with serving_lock(settings):
        return _stop_server(settings)


def _stop_server(settings: Settings) -> str:
    state = read_state(settings)
    stopped = []
    if state and state.get("boot_id") == host.boot_id() and host.process_cmdline(int(state["pid"])) == state.get("cmdline"):
        terminate(int(state["pid"]), state.get("cmdline"))
        stopped.append(int(state["pid"]))
    for pid in find_ours(settings).servers:
        if pid not in stopped:
            terminate(pid, host.process_cmdline(pid))
            stopped.append(pid)
    settings.state_file.unlink(missing_ok=True)
    cleaned = end_orphans(settings)
    if mps.stop(mps_plan(settings)):
        cleaned.append("CUDA MPS daemon")
    if stopped:
        return f"stopped tritonserver (pid {', '.join(map(str, stopped))})" + (f"; cleaned {len(cleaned)} leftovers" if cleaned else "")
    return "no server of ours is running" + (f"; cleaned {len(cleaned)} leftovers of a dead one" if cleaned else "")


def _failure(settings: Settings, what: str) -> UserError:
    text = settings.log_file.read_text(errors="replace") if settings.log_file.exists() else ""
    lines = relevant_log_lines(text)
    fixes = []
    for pitfall in explain("\n".join(lines) or text):
        fixes.append(f"{pitfall.cause}: {pitfall.fix}")
    detail = "\n  ".join(lines[-10:]) or "(the log is empty)"
    print(f"tritonserver log ({settings.log_file}), relevant lines:\n  {detail}", file=sys.stderr)
    return UserError(f"{what}; see {settings.log_file}", "; ".join(dict.fromkeys(fixes)) or "read the log lines above")


def start_server(
    settings: Settings, install: Installation | None = None, cuda_mps: tuple[mps.Plan, dict[str, str], str] | None = None
) -> dict[str, Any]:
    """Start a server of ours. `cuda_mps`: what ensure_server already proved (_cuda_mps; None: decide here)."""
    install = install or locate_tritonserver()
    plan, mps_env, mps_note = cuda_mps or _cuda_mps(settings, mps_plan(settings))
    if not plan.wanted:
        mps.stop(plan)  # a daemon left from an earlier setting; no server of ours runs at this point
    check_ports_free(settings)
    backend_dir = prepare_backend_dir(install, settings.server_dir)
    admin_key = secrets.token_urlsafe(24)
    cmd = server_command(install, settings, backend_dir, admin_key)
    env = server_environment(install)
    client_key = client.create_key()
    restricted = restricted_arguments(admin_key, client_key)
    placeholders, hidden_env = hide_arguments(restricted, build_shim(settings.server_dir), env.get("LD_PRELOAD"))
    assert all(arg in cmd for arg in placeholders)
    env.update(hidden_env)
    settings.server_dir.mkdir(parents=True, exist_ok=True)
    env.update(mps_env)
    rotate(settings.log_file, 0)  # one log per start; the previous start's is kept
    log.info("starting tritonserver (%s) on %s: http %d, grpc %d, metrics %d", install.origin, settings.host, *settings.ports.values())
    fd = os.open(settings.log_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as log_handle:
        process = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_handle,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # outlives snakemake and its process group
            cwd=settings.server_dir,
            umask=0o077,  # the Python backend's /dev/shm regions (requests, responses) and any file it writes: ours only
        )
    state = {
        "pid": process.pid,
        "boot_id": host.boot_id(),
        "cmdline": cmd,
        "admin_key": admin_key,
        "client_key_digest": client.key_digest(client_key, admin_key),  # the key file changed -> restart
        "ports": settings.ports,
        "host": settings.host,
        "repository": settings.repository,
        "models": settings.models,
        "origin": install.origin,
        "cuda_mps": {"wanted": plan.wanted, "active": bool(mps_env), "reason": mps_note},
        "log": str(settings.log_file),
        "started_at": time.time(),
        "ready": False,  # until then its stubs are still starting: the supervisor counts none
    }
    record_loaded(settings, state, settings.models)
    write_state(settings, state)
    wait_until_ready(settings, process)
    state.update(ready=True, ready_after_s=round(time.time() - state["started_at"], 1))
    write_state(settings, state)
    log.info("tritonserver ready after %.1f s (pid %d, log %s)", state["ready_after_s"], process.pid, settings.log_file)
    return state


def _cuda_mps(settings: Settings, plan: mps.Plan) -> tuple[mps.Plan, dict[str, str], str]:
    """(plan, environment, note): where MPS is wanted, the environment that puts the server under our daemon,
    started (or found running) and proven here; no environment and why not where it is not wanted, or does
    not work and server.cuda_mps is auto."""
    if not plan.wanted:
        return plan, {}, plan.reason
    problem = mps.start(plan)
    if not problem:
        return plan, plan.environment, plan.reason
    if settings.server.cuda_mps == "on":
        raise UserError(f"server.cuda_mps is on, but {problem}", "set server.cuda_mps: auto (serve without MPS) or off")
    log.warning("serving without CUDA MPS: %s", problem)
    return plan, {}, problem


def _failed_models(settings: Settings) -> list[str]:
    """Models whose load failed, from the server log (with --exit-on-error=false the server goes on)."""
    text = settings.log_file.read_text(errors="replace") if settings.log_file.exists() else ""
    return [m for m in settings.models if f"failed to load '{m}'" in text]


def _loaded_models(log_text: str, models: list[str]) -> list[str]:
    return [m for m in models if f"successfully loaded '{m}'" in log_text]


def wait_until_ready(settings: Settings, process: subprocess.Popen) -> None:
    """Poll /v2/health/ready while watching the process and its log; explain failures."""
    started = time.monotonic()
    last_report = started
    while True:
        if process.poll() is not None:
            raise _failure(settings, f"tritonserver exited with status {process.returncode} during startup")
        if is_ready(settings):
            return
        failed = _failed_models(settings)
        if failed:  # the others are up: they keep serving, the failure is explained
            serving = [m for m in settings.models if client.model_ready(settings.url(), m)]
            if len(serving) + len(failed) == len(settings.models):
                if not serving:
                    terminate(process.pid, None)
                what = f"model {', '.join(failed)} failed to load" + (f"; {', '.join(serving)} serving" if serving else "")
                raise _failure(settings, what)
        elapsed = time.monotonic() - started
        if elapsed > settings.server.startup_timeout_s:
            terminate(process.pid, None)
            raise _failure(settings, f"tritonserver not ready after {settings.server.startup_timeout_s} s (server.startup_timeout_s)")
        if time.monotonic() - last_report >= 10:
            text = settings.log_file.read_text(errors="replace")
            loaded = _loaded_models(text, settings.models)
            pending = [m for m in settings.models if m not in loaded]
            log.info(
                "waiting for tritonserver: %.0f s; loaded: %s; loading: %s", elapsed, ", ".join(loaded) or "-", ", ".join(pending) or "-"
            )
            last_report = time.monotonic()
        time.sleep(0.25)


def reload_models(settings: Settings, state: dict[str, Any], models: tuple[str, ...], broken: tuple[str, ...] = ()) -> list[str]:
    """Load new versions of `models` into the running server (explicit model control; restricted API with
    the admin key from the state file). No unload first: Triton replaces a loaded model only when the new
    version loads, so a failed change leaves the old version serving (tested). `broken` models (a dead stub:
    they serve nothing) are unloaded first, since Triton does not reload an unchanged model. Returns the models
    that loaded; raises after trying all of them if any failed, naming what still serves."""
    headers = {RESTRICTED_KEY_HEADER: state["admin_key"]}
    base = f"http://{settings.url()}/v2"
    loaded, failed = [], []
    for name in models:
        started = time.monotonic()
        if name in broken:
            client.http_post(f"{base}/repository/models/{name}/unload", headers)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while client.model_ready(settings.url(), name) and time.monotonic() < deadline:
                time.sleep(0.2)
        try:
            status, body = client.http_post(f"{base}/repository/models/{name}/load", headers, timeout=settings.server.startup_timeout_s)
        except (TimeoutError, OSError) as err:
            status, body = 0, f"no answer within server.startup_timeout_s = {settings.server.startup_timeout_s} s ({err})"
        if status == 200:
            loaded.append(name)
            log.info("reloaded %s in %.1f s", name, time.monotonic() - started)
            continue
        still = "the previous version keeps serving" if client.model_ready(settings.url(), name) else "it is not serving"
        failed.append(f"{name} ({status}: {body[:300]}; {still})")
    if failed:
        record_loaded(settings, state, loaded)
        write_state(settings, state)
        raise _failure(settings, "loading the new version failed for " + "; ".join(failed))
    return loaded


def foreign_server(settings: Settings) -> str:
    """'' unless a server of this repository runs that another work directory's state file describes (a run of
    another paths.work or config took the repository over): then which, and whose. Each runs in its server directory."""
    found = {}
    for pid in find_ours(settings).servers:
        where = process_cwd(pid)
        if where is None or where == settings.server_dir or where.name != settings.server_dir.name:
            continue
        other = replace(settings, work=str(where.parent))
        state = read_state(other)
        if state and state.get("pid") == pid and host.process_cmdline(pid) == state.get("cmdline"):
            found[pid] = other.work
    works, pids = ", ".join(sorted(set(found.values()))), ", ".join(map(str, found))
    return f"the server of {works} (pid {pids}) serves {settings.repository} now" if found else ""


def ensure_server(settings: Settings, take_over: bool = True) -> dict[str, Any]:
    """Keep a current, ready server: start, restart, or reload only the models that changed. Under the
    serving lock: a second caller waits, then finds this one's server and keeps it. `take_over`: a server of another
    work directory is replaced, its supervisor stopped first (else the two would replace each other's server for
    ever); the supervisor's repairs pass False: it steps aside instead."""
    with serving_lock(settings):
        state = _ensure_server(settings, take_over)
    # the gateways of the work directories taken over: theirs would answer 503 on their port for ever, and once their
    # supervisor and server are gone, nothing finds them (stopped outside this lock: each takes its own directory's)
    for other in state.pop("taken_over", []):
        log.info("%s: %s", other.work, stop_gateway(other))
    return state


def _ensure_server(settings: Settings, take_over: bool = True) -> dict[str, Any]:
    install = locate_tritonserver()
    client.create_key()  # serve makes the client key, once; a server started before a lost key file restarts
    state = read_state(settings)
    facts = observe(settings, state)
    wanted = None
    if state and facts.cmdline_matches:
        backend_dir = prepare_backend_dir(install, settings.server_dir)
        wanted = server_command(install, settings, backend_dir, state.get("admin_key", ""))
    plan = mps_plan(settings)
    decision = decide(state, facts, wanted, plan.wanted)
    log.info("server: %s (%s)", decision.action, decision.reason)
    if decision.action == "reload":
        reload_models(settings, state, decision.models, decision.broken)
        record_loaded(settings, state, settings.models)
        write_state(settings, state)
    if decision.action in ("start", "restart"):
        # Servers of ours the state file does not describe (lost or corrupt state) cannot be reloaded
        # without their key: they are replaced too, but only once the new settings are known to work.
        replaced = [int(state["pid"])] if decision.action == "restart" else []
        replaced += [pid for pid in find_ours(settings).servers if pid not in replaced]
        check_can_listen(settings, held_by_replaced=replaced)
        cuda_mps = _cuda_mps(settings, plan)  # proven before anything running is touched
        taken_over = []
        if take_over:  # before their server goes: they would start it again, and replace this one
            for stopped in stop_supervisors(settings.repository, unless_work=settings.work):
                log.info("stopped %s: this run serves %s now", stopped, settings.repository)
                taken_over.append(stopped.settings)
            replaced += [pid for pid in find_ours(settings).servers if pid not in replaced]  # one a stopped repair started
        elif foreign := foreign_server(settings):
            raise UserError(foreign, "nothing to repair: that run's supervisor supervises it")
        for pid in replaced:
            log.info("stopping tritonserver pid %d", pid)
            terminate(pid, host.process_cmdline(pid))
        end_orphans(settings)
        state = {**start_server(settings, install, cuda_mps), "taken_over": taken_over}
    return {**state, "action": decision.action, "reason": decision.reason}


def server_status(settings: Settings) -> dict[str, Any]:
    state = read_state(settings)
    facts = observe(settings, state)
    # hand edits or deletions in the rendered repository: what runs is not what was rendered
    edited = {name: found for name in settings.models if (found := integrity.problems(Path(settings.repository) / name))}
    status: dict[str, Any] = {
        "running": facts.cmdline_matches,
        "ready": facts.ready,
        "current": bool(state) and state.get("digests") == facts.digests and not facts.dead_stubs and not edited,
        **({"changed_since_rendered": edited} if edited else {}),
        **settings.endpoints,
        "log": str(settings.log_file),
    }
    if state and facts.cmdline_matches:
        status.update(pid=state["pid"], uptime_s=round(time.time() - state["started_at"]), origin=state.get("origin"))
        status["models"] = {name: client.model_ready(settings.url(), name) for name in state.get("models", [])}
        if state.get("cuda_mps", {}).get("wanted"):
            status["cuda_mps"] = "on" if state["cuda_mps"]["active"] else f"wanted, not working: {state['cuda_mps']['reason']}"
    return status
