"""Targets `serve`, `status` and `stop`: the long-lived server, driven through hf2triton.triton.process."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from hf2triton import host
from hf2triton.errors import UserError
from hf2triton.gateway.process import ensure_gateway, exposure, gateway_status, log_file, require_api_key, stop_gateway
from hf2triton.integrity import damaged
from hf2triton.specs import OpenAISpec, ProjectSpec, ServerSpec, from_param
from hf2triton.triton import client
from hf2triton.triton.cleanup import find_ours, find_supervisors, process_cwd, stop_supervisors
from hf2triton.triton.process import ensure_server, server_status, serving_lock, stop_server
from hf2triton.triton.settings import REPOSITORY, Settings
from hf2triton.triton.state import read_state
from hf2triton.triton.supervisor import ensure_supervisor, stop_supervisor, supervisor_status
from hf2triton.triton.supervisor import log_file as supervisor_log

FAILED_REPORT = "failed-report.md"  # next to the validation report: written by a failed validation
SEES_TRITON_S = 20  # how long serve's gateway check waits for a surviving gateway to see a restarted Triton


def settings_from_params(server: dict[str, Any], models: list[str], work: str, repository: str) -> Settings:
    """Settings from a rule's params (the server spec travels as a dict: see hf2triton.specs.to_param)."""
    return Settings.of(from_param(ServerSpec, server), models, work, repository)


def serve_step(
    server: dict[str, Any], models: list[str], work: str, repository: str, openai: dict[str, Any], gateway_report: str = ""
) -> dict[str, Any]:
    """Target `serve`: ensure the server (and the OpenAI gateway when enabled) is up and current, then say
    where and what it serves."""
    settings = settings_from_params(server, models, work, repository)
    gateway_spec = from_param(OpenAISpec, openai)
    require_api_key(exposure(gateway_spec, settings.host))  # before anything running is touched
    with serving_lock(settings):  # one serve at a time: a second one waits, then keeps what the first started
        status = _serve(settings, gateway_spec, gateway_report)
        for stopped in stop_supervisors(settings.repository, unless_work=settings.work):  # where ensure_server kept a server
            print(f"hf2triton: stopped {stopped}: this serve supervises {settings.repository} now", file=sys.stderr)
            if stopped.settings.work != settings.work:
                print(f"hf2triton: {stopped.settings.work}: {stop_gateway(stopped.settings)}", file=sys.stderr)
        if settings.server.supervise:  # started last: it supervises what has just been proven to serve
            spec = {"server": server, "models": models, "work": work, "repository": repository, "openai": openai}
            status["supervisor"] = ensure_supervisor(settings, spec)
            print(f"hf2triton: supervisor {status['supervisor']}: restarts what crashes ({supervisor_log(settings)})", file=sys.stderr)
        else:
            stop_supervisor(settings)
        return status


def _serve(settings: Settings, gateway_spec: OpenAISpec, gateway_report: str) -> dict[str, Any]:
    models = settings.models
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
    if gateway_spec.enabled:
        gateway = ensure_gateway(settings, gateway_spec)
        print(
            f"hf2triton: OpenAI-compatible API at http://{gateway['url']}/v1 (gateway {gateway['action']}); "
            f"playground page: http://{gateway['url']}/playground/",
            file=sys.stderr,
        )
        status["openai"] = gateway_status(settings, gateway_spec)
        if gateway_report:
            restarted = state["action"] in ("start", "restart") and gateway["action"] == "kept"
            check_served_gateway(settings, gateway_spec, f"http://{gateway['url']}/v1", gateway_report, restarted)
    else:
        stop_gateway(settings)  # disabled since the last serve
    return status


def gateway_sees(base: str, models: list[str], key: str | None, timeout_s: float = SEES_TRITON_S) -> str:
    """Wait (at most `timeout_s`) until the gateway's /health says Triton is ready and /v1/models lists every
    model: a gateway that outlived tritonserver reconnects to the new one. '' when it does, else what it said last."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    deadline = time.monotonic() + timeout_s
    while True:
        status, body = client.http_get(f"{base.removesuffix('/v1')}/health", timeout=5)
        if status != 200:
            problem = f"/health answered {status or 'nothing'}: {body[:200]}"
        else:
            status, body = client.http_get(f"{base}/models", timeout=5, headers=headers)
            try:
                listed = {m["id"] for m in json.loads(body)["data"]}
            except (ValueError, KeyError, TypeError):
                listed = set()
            missing = [name for name in models if name not in listed]
            problem = f"/v1/models answered {status}: {body[:200]}" if status != 200 else ""
            problem = problem or (f"/v1/models does not list {', '.join(missing)}" if missing else "")
        if not problem or time.monotonic() >= deadline:
            return problem
        time.sleep(0.5)


def check_served_gateway(settings: Settings, spec: OpenAISpec, base: str, report_stem: str, restarted: bool = False) -> None:
    """The gateway answers as Triton does (results/validation/gateway.{json,md}); a failed check stops `serve`.
    `restarted`: tritonserver was (re)started under a gateway that kept running."""
    from hf2triton.gateway.checks import api_key, check_gateway, write_report
    from hf2triton.triton.commands import model_facts

    problem = gateway_sees(base, settings.models, api_key(spec.api_key_env))
    if problem:
        triton = "the restarted Triton" if restarted else "Triton's models"
        raise UserError(
            f"the gateway does not see {triton} within {SEES_TRITON_S} s: {problem}",
            f"read {log_file(settings)}; `make stop` then `make serve` starts both afresh",
        )
    grpc_url = settings.url("grpc_port")
    facts = {name: model_facts(grpc_url, name) for name in settings.models}
    report = check_gateway(base, grpc_url, settings.url(), facts, api_key(spec.api_key_env))
    write_report(report, report_stem)
    if not report["ok"]:
        failed = "; ".join(f"{c['name']}: {c['detail']}" for c in report["checks"] if not c["ok"])
        raise UserError(f"the OpenAI gateway answers unlike Triton: {failed}", f"read {report_stem}.md and {log_file(settings)}")
    print(f"hf2triton: gateway checked ({len(report['checks'])} checks ok): {report_stem}.md", file=sys.stderr)


def status_step(
    server: dict[str, Any],
    models: list[str],
    work: str,
    repository: str,
    openai: dict[str, Any],
    built: dict[str, str] | None = None,
    validation: str = "",
) -> dict[str, Any]:
    """Target `status`: the server as it runs, whether it serves what was built (rendered models, saved
    weights and exports against their manifests) and what the last validation said."""
    settings = settings_from_params(server, models, work, repository)
    status = server_status(settings)
    rendered = Path(repository).resolve()
    changed = {path: found for path, found in damaged(built or {}).items() if rendered not in Path(path).resolve().parents}
    if changed:  # weights or an export changed under the running server (the rendered models: changed_since_rendered)
        status.update(current=False, changed_since_built=changed)
    if validation:
        status["validation"] = validation_outcome(validation)
        status["current"] = status["current"] and status["validation"] == "passed"
    status["openai"] = gateway_status(settings, from_param(OpenAISpec, openai))
    status["supervisor"] = supervisor_status(settings)
    status["torch"] = host.torch_facts()
    print(json.dumps(status, indent=2))
    return status


def validation_outcome(report_json: str) -> str:
    """ "passed", "failed: see <failed-report.md>" or "not run": a failed validation leaves its failed report
    and no report.json (Snakemake removes a failed job's outputs); a passing one removes the failed report."""
    failed = Path(report_json).parent / FAILED_REPORT
    if failed.is_file():
        return f"failed: see {failed}"
    return "passed" if Path(report_json).is_file() else "not run"


def stop_step(server: dict[str, Any], models: list[str], work: str, repository: str) -> str:
    message = stop_serving(settings_from_params(server, models, work, repository))
    print(f"hf2triton: {message}", file=sys.stderr)
    return message


def stop_serving(configured: Settings | None, repository: str = "", also: tuple[str, ...] = ()) -> str:
    """Stop everything that serves this repository (`configured`'s, else `repository`): every supervisor first (one
    left would start the rest again), then each work directory's gateway and server. Work directories: the configured
    one, those of `also` that exist, and those of the running supervisors (their spec files) and servers (where they
    run) of this repository: a config of another paths.work, or a typo in the config since, must not leave a
    supervisor restarting everything."""
    repository = configured.repository if configured else str(Path(repository).resolve())
    everywhere = _serving_settings(repository, configured, also)
    done: dict[str, list[str]] = {settings.work: [] for settings in everywhere}
    for settings in everywhere:
        with serving_lock(settings):  # not while a serve is starting them
            done[settings.work].append(stop_supervisor(settings))
    unnamed = [f"stopped {stopped}" for stopped in stop_supervisors(repository)]  # no supervisor state file names them
    for settings in everywhere:
        with serving_lock(settings):
            done[settings.work] += [stop_gateway(settings), stop_server(settings)]
    if len(done) == 1:
        return "; ".join([*next(iter(done.values())), *unnamed])
    return "; ".join([*(f"{work}: {', '.join(lines)}" for work, lines in done.items()), *unnamed]) or "nothing of this project runs"


def _serving_settings(repository: str, configured: Settings | None, also: tuple[str, ...]) -> list[Settings]:
    """The settings of each work directory serving `repository` (see stop_serving), the configured one first."""
    found = {settings.work: settings for settings in [configured] if settings}
    for supervisor in find_supervisors(repository):
        found.setdefault(supervisor.settings.work, supervisor.settings)
    server_dirs = [Path(work) / "server" for work in also]
    for pid in find_ours(Settings.of(ServerSpec(), [], ProjectSpec.work, repository)).servers:  # (only the repository counts)
        server_dirs.append(process_cwd(pid) or Path("/nonexistent"))
    for server_dir in server_dirs:
        if server_dir.name == "server" and server_dir.is_dir():  # (one that is not: no state, no lock to create)
            settings = _settings_of_work(str(server_dir.parent), repository)
            found.setdefault(settings.work, settings)
    return list(found.values())


def _settings_of_work(work: str, repository: str) -> Settings:
    """A work directory's settings as its server's state file records them (its gateway is found by its gRPC port),
    else the defaults: what stop_gateway and stop_server need."""
    settings = Settings.of(ServerSpec(), [], work, repository)
    state = read_state(settings) or {}
    try:
        server = ServerSpec(host=state.get("host", ServerSpec.host), **state.get("ports", {}))
        return Settings.of(server, state.get("models", []), work, repository)
    except TypeError:  # not a state file of ours
        return settings


def stop_project(config: str | None = None) -> str:
    """`python -m hf2triton stop` (`make stop` when snakemake's stop fails): stop this project's supervisors, gateways
    and tritonserver whatever the config says -- a typo made while serving, a local model source gone, a vLLM model
    on a host without GPU. The project is the current directory; the config only adds its work directory."""
    from hf2triton.config import load_project
    from hf2triton.triton.commands import config_path

    repository, path = str(Path(REPOSITORY).resolve()), config_path(config)
    try:
        project = load_project(path)
        configured, also = Settings.of(project.server, list(project.names), project.work, repository), ()
    except Exception as err:  # noqa: BLE001 - whatever is wrong with it, stopping must not depend on it
        print(f"hf2triton: the config ({path}) does not load ({getattr(err, 'message', err)}): stopping what runs", file=sys.stderr)
        configured, also = None, (ProjectSpec.work,)  # the default work directory, besides those found running
    message = stop_serving(configured, repository, also)
    print(f"hf2triton: {message}")
    return message
