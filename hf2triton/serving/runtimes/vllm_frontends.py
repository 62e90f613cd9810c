"""backend vllm with `vllm.frontends: N > 1`: N Triton instances of one model in front of one vLLM EngineCore, as
`vllm serve --api-server-count N` puts N API servers in front of one (issue 46: at 128 streaming clients one Python
process -- the stub's output handler, detokenizer and response sends -- carries every token and is the ceiling).

Triton starts the N instances as N stub processes and hands each request to whichever instance is idle (its default
scheduler's shared queue), so the requests spread over N processes. Instance 0 (the *owner*) launches the engine
with vLLM's own multi-frontend machinery (`launch_core_engines` with N input/output address pairs, the engine routes
each output to its request's `client_index`); every instance then builds its own AsyncLLM client bound to its pair
(`client_addresses`, `client_count`, `client_index`: what vllm serve's API server processes do). The instances meet
in a rendezvous directory (/dev/shm, keyed by the repository, the model and the tritonserver process):
`rendezvous.json` names the session's addresses, the owner's and the engine's pids and the state (starting | ready |
failed | stopping), and `load` holds each frontend's open requests (one int64 slot each) so the model's admission
(max_num_seqs running + max_queue waiting) counts all of them.

Lifecycle: the owner's client monitors the engine process as a single-process AsyncLLM does, and its shutdown stops
the engine (every frontend's open requests then end as aborted: "cancelled"); the other instances watch the engine's
and the owner's process and fail their streams (vLLM's EngineDeadError) when the engine goes, stopping the engine
themselves if the owner died without it. A frontend that dies cannot rejoin (vLLM sends READY once): reload the model.

Standard library only at import (vllm names are imported inside the functions that use them, in the vLLM
environment). vLLM's internals used here (launch_core_engines, EngineZmqAddresses, AsyncEngineArgs'
_api_process_count/_api_process_rank, the client's engine_manager) are vLLM 0.22.1's (envs/vllm.txt pins it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import re
import select
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RENDEZVOUS = "rendezvous.json"
LOAD = "load"  # one int64 slot per frontend: its open requests
WAIT_POLL_S = 0.1  # how often a frontend reads the rendezvous while the owner starts the engine
WATCH_S = 0.5  # how often a frontend looks at the engine's and the owner's process
READY_TIMEOUT_S = float(os.environ.get("VLLM_ENGINE_READY_TIMEOUT_S", "600"))  # vLLM's own limit for an engine's start


class FrontendError(RuntimeError):
    """The model's frontends could not meet (the owner failed or went, the rendezvous timed out)."""


@dataclass(frozen=True)
class Frontend:
    """This instance's place among its model's frontends: `index` 0 owns the engine."""

    index: int
    count: int
    directory: str  # the rendezvous directory the model's instances in this tritonserver share

    @property
    def owner(self) -> bool:
        return self.index == 0


def instance_index(instance_name: str) -> int:
    """The instance's index in its group: Triton names instances `<group>_<c>` (the group `<model>_<g>`)."""
    match = re.search(r"_(\d+)$", instance_name)
    if match is None:
        raise FrontendError(f"Triton instance name {instance_name!r} does not end in _<index>")
    return int(match.group(1))


SHARED_MEMORY = "/dev/shm"  # noqa: S108 - the directory made there is ours alone (Rendezvous.create, _check_ours)


def rendezvous_root() -> str:
    """Shared memory where there is some (IPC socket paths must stay under 107 bytes: no model directory)."""
    return SHARED_MEMORY if os.path.isdir(SHARED_MEMORY) and os.access(SHARED_MEMORY, os.W_OK) else tempfile.gettempdir()


def frontend_of(args: dict[str, str], count: int, server_pid: int | None = None) -> Frontend | None:
    """The Frontend of the instance Triton's `initialize(args)` describes; None for one frontend (the engine is the
    instance's own, as vLLM's AsyncLLM starts it). `server_pid`: tritonserver's (the stub's parent)."""
    if count <= 1:
        return None
    index = instance_index(args.get("model_instance_name", ""))
    if index >= count:
        raise FrontendError(f"instance {args.get('model_instance_name')!r}: index {index} beyond vllm.frontends = {count}")
    server = os.getppid() if server_pid is None else server_pid
    # the model's config too: a reload with another config (Triton loads the new instances before it unloads the
    # old ones) meets in a directory of its own
    parts = (os.path.realpath(args.get("model_repository", "")), args.get("model_name", ""), str(server), args.get("model_config", ""))
    key = "\0".join(parts)
    name = "h2t-" + hashlib.sha1(key.encode(), usedforsecurity=False).hexdigest()[:12]
    return Frontend(index, count, os.path.join(rendezvous_root(), name))


def addresses(frontend: Frontend, session: str) -> tuple[list[str], list[str]]:
    """Each frontend's ZMQ input (requests to the engine) and output (its outputs back) address."""
    base = os.path.join(frontend.directory, session)
    return [f"ipc://{base}-in{i}" for i in range(frontend.count)], [f"ipc://{base}-out{i}" for i in range(frontend.count)]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: alive
        return True
    return True


class Rendezvous:
    """The rendezvous directory: its JSON (written whole, then renamed: a reader never sees half of it) and the
    shared load slots."""

    def __init__(self, frontend: Frontend):
        self.frontend = frontend
        self.path = os.path.join(frontend.directory, RENDEZVOUS)
        self.slots: memoryview | None = None

    def create(self) -> None:
        """The owner: a fresh directory (a stale one of an earlier load of this model in this server is emptied)."""
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.frontend.directory, mode=0o700)
        self._check_ours()
        for name in os.listdir(self.frontend.directory):
            os.unlink(os.path.join(self.frontend.directory, name))

    def _check_ours(self) -> None:
        """The directory's name is predictable in a shared place: it must be a real directory of this user's, closed
        to others, or no frontend trusts (or binds sockets in) it."""
        info = os.lstat(self.frontend.directory)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise FrontendError(f"{self.frontend.directory}: not a private directory of this user's (remove it and reload the model)")

    def publish(self, **fields: Any) -> None:
        state = {**(self.read() or {}), **fields}
        fd, tmp = tempfile.mkstemp(dir=self.frontend.directory, prefix=".rendezvous-")
        with os.fdopen(fd, "w") as handle:
            json.dump(state, handle)
        os.replace(tmp, self.path)

    def read(self) -> dict[str, Any] | None:
        try:
            with open(self.path) as handle:
                return json.load(handle)
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
        """A frontend but the owner: the session once the owner's engine is ready; FrontendError if the owner
        failed, went or did not get there in `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.read()
            if state:
                self._check_ours()
            if state and alive(state["owner_pid"]):
                if state["state"] == "ready":
                    return state
                if state["state"] != "starting":  # failed, or the model is being unloaded
                    raise FrontendError(f"the owner instance's engine {state['state']}: {state.get('error', 'see the server log')}")
            time.sleep(WAIT_POLL_S)
        raise FrontendError(f"no ready engine in {self.frontend.directory} after {timeout_s:.0f} s (the owner instance's log says why)")

    def open_load(self) -> None:
        """Map the load slots (created by whoever comes first; each frontend writes only its own)."""
        size = 8 * self.frontend.count
        fd = os.open(os.path.join(self.frontend.directory, LOAD), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            mapped = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.slots = memoryview(mapped).cast("q")

    def set_load(self, count: int) -> None:
        if self.slots is not None:
            self.slots[self.frontend.index] = count

    def others_load(self) -> int:
        """Open requests of the model's other frontends."""
        if self.slots is None:
            return 0
        return sum(self.slots) - self.slots[self.frontend.index]

    def close(self, remove: bool) -> None:
        """The owner removes the directory; the load slots stay mapped (response threads still count the last
        final responses out after the engine's shutdown; the mapping goes with the process)."""
        if remove:
            for name in os.listdir(self.frontend.directory) if os.path.isdir(self.frontend.directory) else ():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.frontend.directory, name))
            with contextlib.suppress(OSError):
                os.rmdir(self.frontend.directory)


class ProcessWatch:
    """Waits on processes (pidfd: no pid reuse) and calls `gone(pid)` for the first that exits."""

    def __init__(self, pids: list[int], gone: Callable[[int], None]):
        self.fds = {}
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                self.fds[os.pidfd_open(pid)] = pid
        self.missing = [pid for pid in pids if pid not in self.fds.values()]
        self.gone, self.stopping = gone, threading.Event()
        self.thread = threading.Thread(target=self._run, name="hf2triton-vllm-watch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        if self.missing:
            self.gone(self.missing[0])
            return
        while not self.stopping.is_set():
            ready, _, _ = select.select(list(self.fds), [], [], WATCH_S)
            if ready and not self.stopping.is_set():
                self.gone(self.fds[ready[0]])
                return

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=2 * WATCH_S)
        for fd in self.fds:
            os.close(fd)


# ---------------------------------------------------------------- vLLM's side (inside the vLLM environment)


def engine_config(engine_args: type, arguments: dict[str, Any], frontend: Frontend, rank: int, usage: Any) -> Any:
    """The VllmConfig of the engine (rank -1) or of frontend `rank`, as vllm serve builds each (serve.py,
    api_server.py): the same arguments, the process count and this process's rank."""
    args = engine_args(**arguments)
    args._api_process_count, args._api_process_rank = frontend.count, rank
    return args.create_engine_config(usage_context=usage)


class SharedEngine:
    """One frontend's AsyncLLM client of the shared engine (`llm`), the rendezvous and, for non-owners, the watch."""

    def __init__(self, names: tuple, arguments: dict[str, Any], frontend: Frontend, log: Callable[[str], None]):
        engine_args, _, _, _, usage, async_llm = names
        self.frontend, self.log = frontend, log
        self.rendezvous = Rendezvous(frontend)
        self.watch: ProcessWatch | None = None
        usage = usage.OPENAI_API_SERVER
        if frontend.owner:
            self.rendezvous.create()
            self.rendezvous.open_load()
            state, manager = self._launch(engine_args, arguments, usage)
        else:
            state = self.rendezvous.wait_ready()
            self.rendezvous.open_load()
            manager = None
        inputs, outputs = state["inputs"], state["outputs"]
        client = {"input_address": inputs[frontend.index], "output_address": outputs[frontend.index]}
        config = engine_config(engine_args, arguments, frontend, frontend.index, usage)
        self.llm = async_llm.from_vllm_config(
            config,
            usage_context=usage,
            disable_log_stats=True,
            client_addresses=client,
            client_count=frontend.count,
            client_index=frontend.index,
        )
        if manager is not None:  # the owner's client watches the engine and stops it, as a single-process AsyncLLM's
            self.llm.engine_core.resources.engine_manager = manager
            self.llm.engine_core.start_engine_core_monitor()
        else:
            self.watch = ProcessWatch([state["engine_pid"], state["owner_pid"]], self._gone)
        self.engine_pid = state["engine_pid"]
        log(f"hf2triton: vLLM frontend {frontend.index + 1} of {frontend.count} joined engine pid {state['engine_pid']}")

    def _launch(self, engine_args: type, arguments: dict[str, Any], usage: Any) -> tuple[dict[str, Any], Any]:
        from vllm.v1.engine.utils import EngineZmqAddresses, launch_core_engines
        from vllm.v1.executor import Executor

        session = uuid.uuid4().hex[:8]
        inputs, outputs = addresses(self.frontend, session)
        pids = {"owner_pid": os.getpid(), "server_pid": os.getppid()}
        self.rendezvous.publish(session=session, count=self.frontend.count, **pids, inputs=inputs, outputs=outputs, state="starting")
        try:
            config = engine_config(engine_args, arguments, self.frontend, -1, usage)
            zmq_addresses = EngineZmqAddresses(inputs=list(inputs), outputs=list(outputs))
            # the `with` exit waits for the engine's READY (model loaded, KV cache sized); the frontends bind their
            # sockets after it: the engine's READY to each waits in ZMQ's queue until then
            with launch_core_engines(config, Executor.get_class(config), False, zmq_addresses, self.frontend.count) as started:
                manager = started[0]
        except BaseException as err:
            self.rendezvous.publish(state="failed", error=f"{type(err).__name__}: {err}")
            raise
        self.rendezvous.publish(state="ready", engine_pid=manager.processes[0].pid)
        return self.rendezvous.read(), manager

    def _gone(self, pid: int) -> None:
        """A non-owner: the engine or the owner's stub exited. The engine is stopped (an owner gone leaves it
        orphaned) and this client is shut as vLLM's own monitor does: every open stream fails (EngineDeadError)."""
        if (self.rendezvous.read() or {}).get("state") == "ready":  # else the owner is unloading the model (stopping, removed)
            what = "the engine" if pid == self.engine_pid else "the owner instance"
            self.log(f"hf2triton: vLLM frontend {self.frontend.index}: {what} (pid {pid}) exited; its streams fail, reload the model")
        if pid != self.engine_pid and alive(self.engine_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.engine_pid, 15)
        core = self.llm.engine_core
        core.resources.engine_dead = True
        core.shutdown()

    def set_load(self, count: int) -> None:
        self.rendezvous.set_load(count)

    def others_load(self) -> int:
        return self.rendezvous.others_load()

    def shutdown(self) -> None:
        """The owner stops the engine (every frontend's open requests end as aborted) and removes the rendezvous;
        another frontend closes its client's sockets."""
        if self.watch is not None:
            self.watch.stop()
        if self.frontend.owner:
            self.rendezvous.publish(state="stopping")
        self.llm.shutdown()
        self.rendezvous.close(remove=self.frontend.owner)
