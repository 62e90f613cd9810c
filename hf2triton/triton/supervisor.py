"""The supervisor: what `serve` starts keeps serving without anyone typing `make serve` again.

`serve` starts one small process of ours beside tritonserver and the gateway (`python -m
hf2triton.triton.supervisor SPEC`, its own session, a state file and a log in the server directory). Once a
second it looks at what runs, and when something is wrong it takes the serving lock and calls the same
`ensure_server` / `ensure_gateway` as `serve` -- so a restart is exactly what `make serve` would do:
- tritonserver gone (a crash, an abort, the OOM killer): started again with the same command line;
- a model's stub process gone, or stopped (SIGSTOP, a frozen swap storm) for STALLED_S: the server restarted. Its
  requests died with it, but Triton keeps their streams open without a word (a reload of the model would leave
  them hanging for good); a stopped stub resumed later aborts tritonserver itself (lock_exception) anyway;
- the gateway gone: started again.
Each repair within RESTART_WINDOW_S (a restart that worked too: a server that starts and crashes again) waits longer
after the one before (1, 2, 4 ... MAX_BACKOFF_S); after MAX_RESTARTS of them it gives up and exits, saying so in its
log and in `make status` (`supervisor.gave_up`). `make stop` stops the supervisor first; it also ends by
itself when the server's state file is gone (stopped by other means), and when a server of other settings replaced its
own (a `serve` or `validate` of another config or overlay: that run's `serve` starts the supervisor of its own;
restarting the old settings would kill the new server under the run that is validating it). A run of another work
directory (paths.work) that replaces its server stops it first (the two supervisors replaced each other's server for
ever); it steps aside by itself too when such a server, described by another work directory's state file, serves its
repository. Every action is one line in its log and in `make status` (`supervisor`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf2triton import host
from hf2triton.fsutil import atomic_write_json
from hf2triton.gateway.process import api_key_digest, ensure_gateway, gateway_alive
from hf2triton.logs import rotate, without_secrets
from hf2triton.specs import OpenAISpec, from_param
from hf2triton.triton.cleanup import find_ours, terminate
from hf2triton.triton.process import ensure_server, foreign_server, serving_lock
from hf2triton.triton.settings import Settings, redacted_command, settings_of_spec
from hf2triton.triton.state import dead_stub_models, read_state

log = logging.getLogger("hf2triton.supervisor")

POLL_S = 1.0
STALLED_S = 5.0  # a stub stopped this long is killed and its model reloaded
MAX_BACKOFF_S = 60.0
RESTART_WINDOW_S = 600.0  # repairs this recent count towards the backoff and the limit
MAX_RESTARTS = 8  # repairs within RESTART_WINDOW_S before the supervisor gives up (waits 1+2+...+60 s: about 2 min)
KILLED = ": killed"  # how a problem the supervisor caused itself (a stalled stub it killed) ends
STOPPED_STATES = ("T", "t")  # /proc/<pid>/stat: stopped by a signal, or by a tracer


def spec_file(settings: Settings) -> Path:
    return settings.server_dir / "supervisor-spec.json"


def state_file(settings: Settings) -> Path:
    return settings.server_dir / "supervisor.json"


def log_file(settings: Settings) -> Path:
    return settings.server_dir / "supervisor.log"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _alive(state: dict[str, Any] | None) -> bool:
    return bool(state) and state.get("boot_id") == host.boot_id() and host.process_cmdline(int(state["pid"])) == state.get("cmdline")


def ensure_supervisor(settings: Settings, spec: dict[str, Any]) -> str:
    """The supervisor of this server running with this spec (serve's params) and the gateway API key set now:
    kept, or (re)started. The key matters: the supervisor restarts the gateway with the key in its own environment,
    so one kept across `export HF2TRITON_API_KEY=<new>; make serve` would bring back the old key."""
    state = _read_json(state_file(settings))
    spec = json.loads(json.dumps(spec))  # as the spec file reads back (tuples become lists)
    openai = from_param(OpenAISpec, spec["openai"])
    if (
        _alive(state)
        and _read_json(spec_file(settings)) == spec
        and state.get("api_key_digest") == api_key_digest(openai, state.get("salt", ""))
    ):
        return f"kept (pid {state['pid']})"
    stop_supervisor(settings)
    atomic_write_json(spec_file(settings), spec, mode=0o600)
    command = [sys.executable, "-m", "hf2triton.triton.supervisor", str(spec_file(settings))]
    rotate(log_file(settings))
    with open(log_file(settings), "ab") as out:
        process = subprocess.Popen(  # noqa: S603 - our own module; no hub credentials in a process that runs on and on
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=without_secrets(os.environ)
        )
    salt = secrets.token_hex(16)
    started = {
        "pid": process.pid, "cmdline": command, "boot_id": host.boot_id(), "restarts": [],
        "salt": salt, "api_key_digest": api_key_digest(openai, salt),
    }  # fmt: skip
    atomic_write_json(state_file(settings), started, mode=0o600)
    return f"started (pid {process.pid})"


def stop_supervisor(settings: Settings) -> str:
    """Stop the supervisor (before the server: it would start it again)."""
    state = _read_json(state_file(settings))
    if not _alive(state):
        return "no supervisor running"
    terminate(int(state["pid"]), state["cmdline"])
    return f"stopped the supervisor (pid {state['pid']})"


def supervisor_status(settings: Settings) -> dict[str, Any]:
    state = _read_json(state_file(settings)) or {}
    running = _alive(state)
    restarts = state.get("restarts", [])
    status = {"running": running, "pid": state.get("pid") if running else None, "restarts": len(restarts), "last": restarts[-1:]}
    return status | ({"gave_up": state["gave_up"]} if "gave_up" in state else {})


# ---------------------------------------------------------------- the loop


def _event(line: str) -> dict[str, str]:
    return {"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "what": line}


def stub_model(settings: Settings, pid: int) -> str:
    cmd = host.process_cmdline(pid) or ["", ""]
    return cmd[1].removeprefix(f"{settings.repository}/").split("/")[0] if len(cmd) > 1 else "?"


def reap_children() -> None:
    """Collect the exit of servers and gateways this supervisor started and that ended since: a zombie keeps its
    pid (with an empty command line) until its parent waits for it."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_group(state: dict[str, Any]) -> bool:
    """SIGKILL the tritonserver `state` describes and its stubs (it leads its own process group when we started it),
    if its pid is still that server (boot id and command line, as terminate checks). True when it was killed."""
    pid = int(state["pid"])
    if state.get("boot_id") != host.boot_id() or host.process_cmdline(pid) != state.get("cmdline"):
        return False
    for kill, target in ((os.killpg, pid), (os.kill, pid)):
        try:
            kill(target, signal.SIGKILL)
            return True
        except (ProcessLookupError, PermissionError):
            continue
    return False


def _identity(state: dict[str, Any]) -> tuple[Any, ...]:
    """One server start, as its state file records it."""
    return state.get("boot_id"), state.get("pid"), state.get("started_at")


@dataclass
class RestartWindow:
    """The supervisor's repairs (restarts that worked, and tries that failed) within the last RESTART_WINDOW_S. A
    server that starts and crashes again is restarted later each time, and not for ever: a crash loop needs a person."""

    times: list[float] = field(default_factory=list)

    def recent(self, now: float) -> int:
        self.times = [at for at in self.times if now - at < RESTART_WINDOW_S]
        return len(self.times)

    def delay_s(self, now: float) -> float:
        """How long the next repair waits: 1, 2, 4 ... MAX_BACKOFF_S after the last, by how many there were lately."""
        count = self.recent(now)
        return max(0.0, self.times[-1] + min(MAX_BACKOFF_S, 2.0 ** (count - 1)) - now) if count else 0.0

    def exhausted(self, now: float) -> bool:
        return self.recent(now) >= MAX_RESTARTS

    def add(self, now: float) -> None:
        self.times.append(now)


class Supervisor:
    def __init__(self, settings: Settings, openai: OpenAISpec):
        self.settings, self.openai = settings, openai
        self.stopped_since: dict[int, float] = {}  # stub pid -> when it was first seen stopped
        self.restarts = RestartWindow()
        self.checked: tuple[Any, ...] = ()  # the server start (_identity) that problems() last looked at
        self.command = self.served_command()  # the server it supervises (serve started it just before)

    def served_command(self) -> list[str] | None:
        """The running server's command line (secrets redacted) as its state file records it; None: no state."""
        state = read_state(self.settings)
        return redacted_command(state.get("cmdline", [])) if state else None

    def superseded(self) -> str:
        """Why another run took the server over ('' while none did): a server of other settings runs (or starts) in
        this server directory (another `serve` or `validate`), or one of another work directory serves this repository.
        Its stubs are not ours to count, nor is the server ours to restart."""
        command = self.served_command()
        if command is not None and self.command is not None and command != self.command:
            return "a server of other settings replaced the one supervised here"
        return foreign_server(self.settings)

    def step_aside(self, why: str) -> None:
        log.info("%s: its own serve supervises it; exiting", why)
        raise SystemExit(0)

    def problems(self) -> list[str]:
        """What is wrong now ([] when all serves); kills stubs stopped for STALLED_S on the way."""
        state = read_state(self.settings)
        pid = int(state["pid"]) if state else 0
        if not state or state.get("boot_id") != host.boot_id() or host.process_cmdline(pid) != state.get("cmdline"):
            return [f"tritonserver (pid {pid}) is gone"]
        self.checked = _identity(state)
        found = self.stalled_stubs()
        if state.get("ready"):  # a server still starting (a serve's, a validate's) has not started all its stubs
            found += [f"the stub process of {name} is gone" for name in dead_stub_models(self.settings, state)]
        if self.openai.enabled and not gateway_alive(self.settings):
            found.append("the gateway is gone")
        return found

    def stalled_stubs(self) -> list[str]:
        now, found, seen = time.monotonic(), [], set()
        for pid in find_ours(self.settings).stubs:
            if host.process_state(pid) not in STOPPED_STATES:
                continue
            seen.add(pid)
            since = self.stopped_since.setdefault(pid, now)
            if now - since >= STALLED_S:
                name = stub_model(self.settings, pid)
                found.append(f"the stub process of {name} (pid {pid}) was stopped for {now - since:.0f} s{KILLED}")
                os.kill(pid, signal.SIGKILL)  # a stopped process takes SIGKILL at once, and only SIGKILL
        self.stopped_since = {pid: t for pid, t in self.stopped_since.items() if pid in seen}
        return found

    def repair(self, problems: list[str]) -> bool:
        """What `make serve` does, under its lock; recorded in the state file and the log. A stub that died or was
        killed takes its requests with it, but Triton keeps their streams open without a word (a reload of the model
        leaves them hanging for good): only ending the server's connections ends them, with an error. So a stub
        problem restarts the whole server (SIGKILL: a graceful stop would wait for those requests).
        Every part done is recorded, also when a later part fails (a server restarted, then a gateway that did not
        come up): the next step may find nothing wrong, and the restart must not go unrecorded. Returns whether it
        acted (a restart, or a try that failed): what counts towards MAX_RESTARTS."""
        done: list[str] = []
        try:
            with serving_lock(self.settings):
                state = read_state(self.settings)
                if state is None:  # `make stop` ran meanwhile
                    raise SystemExit(0)
                if why := self.superseded():  # another config's run restarted the server while this one waited for the lock
                    self.step_aside(why)
                # Looked at again under the lock: while this waited, a `serve` or `validate` may have repaired the
                # server, or started one whose stubs are still starting; killing it on the earlier look would kill a
                # healthy server under a validation. A stub this supervisor killed counts against its own server only.
                killed = [problem for problem in problems if problem.endswith(KILLED)] if _identity(state) == self.checked else []
                problems = list(dict.fromkeys([*killed, *self.problems()]))
                if not problems:
                    return False
                if any("stub process" in problem for problem in problems) and kill_group(state):
                    done.append(f"killed tritonserver (pid {state['pid']})")
                server = ensure_server(self.settings, take_over=False)
                if server["action"] != "keep":
                    done.append(f"server {server['action']} ({server['reason']})")
                self.command = self.served_command()  # what this repair started (the same settings)
                if self.openai.enabled:
                    gateway = ensure_gateway(self.settings, self.openai)["action"]
                    if gateway != "kept":
                        done.append(f"gateway {gateway}")
        except Exception as err:
            done.append(f"repair failed: {getattr(err, 'message', repr(err))}")
            raise
        finally:
            if done:  # nothing done: `make serve` repaired it meanwhile
                self.record(f"{'; '.join(problems)} -> {'; '.join(done)}")
        return bool(done)

    def record(self, line: str) -> None:
        log.warning("%s", line)
        state = _read_json(state_file(self.settings)) or {}
        state["restarts"] = [*state.get("restarts", [])[-49:], _event(line)]
        atomic_write_json(state_file(self.settings), state, mode=0o600)

    def give_up(self, problems: list[str]) -> None:
        line = (
            f"gave up after {MAX_RESTARTS} repairs within {RESTART_WINDOW_S / 60:.0f} min; still: {'; '.join(problems)}. "
            "Read the logs in this directory, fix the cause, then `make serve` (it starts the supervisor again)"
        )
        log.error("%s", line)
        state = _read_json(state_file(self.settings)) or {}
        atomic_write_json(state_file(self.settings), {**state, "gave_up": _event(line)}, mode=0o600)
        raise SystemExit(1)

    def step(self) -> None:
        reap_children()
        if why := self.superseded():
            self.step_aside(why)
        problems = self.problems()
        if not problems:
            return
        if read_state(self.settings) is None and not any("stub" in p for p in problems):
            raise SystemExit(0)  # stopped, not crashed: nothing to bring back
        now = time.monotonic()
        if self.restarts.exhausted(now):
            self.give_up(problems)
        delay = self.restarts.delay_s(now)
        if delay:
            log.info("%s; %d repairs lately: the next in %.0f s", "; ".join(problems), self.restarts.recent(now), delay)
            time.sleep(delay)  # the repair looks again under the lock
        try:
            acted = self.repair(problems)
        except Exception as err:  # noqa: BLE001 - the restart failed (a port taken meanwhile, a timeout): the
            # supervisor must outlive it and try again later, longer apart
            log.error("repair failed: %s", getattr(err, "message", repr(err)))
            acted = True
        if acted:
            self.restarts.add(time.monotonic())

    def run(self) -> None:
        log.info("supervising %s (gateway: %s)", self.settings.url(), "on" if self.openai.enabled else "off")
        while True:
            self.step()
            time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hf2triton.triton.supervisor", description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="the spec file serve wrote (supervisor-spec.json)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s supervisor %(levelname)s %(message)s")
    spec = json.loads(Path(args.spec).read_text())
    settings = settings_of_spec(spec)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    Supervisor(settings, from_param(OpenAISpec, spec["openai"])).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
