"""A private CUDA MPS daemon for our server, so that its GPU instances share the GPU instead of taking turns.

Each Triton Python-backend instance is a process with its own CUDA context; without MPS the GPU runs one
context at a time and switches between them. On the H200, 4 and 8 processes replaying a small CUDA graph
each reached 4.2k and 4.2k replays/s alone, 5.3k and 7.8k through MPS (`benchmarks/probes/gpu/mps_check.py`,
benchmarks/h200/README.md). The daemon is started by this user, without root, with its pipe and log directories
under the server's work directory (mode 0700): only processes given that directory — our tritonserver and
its stubs — use it; other CUDA programs on the machine do not. MPS itself serves only clients of the user who
started it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hf2triton import host
from hf2triton.errors import UserError
from hf2triton.logs import without_secrets

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
MODES = ("auto", "on", "off")
SOCKET_PATH_MAX = 100  # a Unix socket path holds 108 bytes; MPS adds "/control_privileged" and similar names
# A CUDA context through the daemon, without torch: proves MPS works here before the server depends on it.
PROBE = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
device, context = ctypes.c_int(), ctypes.c_void_p()
for step, rc in (("cuInit", lambda: cuda.cuInit(0)), ("cuDeviceGet", lambda: cuda.cuDeviceGet(ctypes.byref(device), 0)),
                 ("cuCtxCreate", lambda: cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device))):
    code = rc()
    if code:
        sys.exit(f"{step} failed with CUDA error {code}")
cuda.cuCtxDestroy_v2(context)
"""


@dataclass(frozen=True)
class Plan:
    """Whether the server gets MPS, and where its daemon lives."""

    wanted: bool
    reason: str
    pipe_dir: str = ""
    log_dir: str = ""

    @property
    def environment(self) -> dict[str, str]:
        """What points a CUDA process (and the control command) at our daemon."""
        return {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": self.log_dir}


def directories(server_dir: Path) -> tuple[str, str]:
    """The daemon's pipe and log directories: under the server's directory, or (when that path is too long for
    a Unix socket) a per-user, per-server directory in the temporary directory."""
    pipe = server_dir / "mps"
    if len(str(pipe)) > SOCKET_PATH_MAX - len("/control_privileged"):
        tag = hashlib.sha256(str(server_dir).encode()).hexdigest()[:12]
        pipe = Path(tempfile.gettempdir()) / f"hf2triton-mps-{os.getuid()}-{tag}"
    return str(pipe), str(server_dir / "mps-log")


def plan(mode: str, gpu_processes: int, server_dir: Path) -> Plan:
    """`mode` is server.cuda_mps. auto: on when two or more GPU processes share the GPU and the MPS control
    binary is installed (one process gains nothing); on: required (an error names the fix); off: never.
    The directories are set either way, so that a daemon left from an earlier setting can be stopped."""
    dirs = directories(server_dir)
    if mode not in MODES:
        raise UserError(f"server.cuda_mps = {mode!r} is not one of {', '.join(MODES)}", "set server.cuda_mps to auto, on or off")
    if mode == "off":
        return Plan(False, "server.cuda_mps is off", *dirs)
    if gpu_processes == 0:
        if mode == "on":
            raise UserError("server.cuda_mps is on, but no model runs on a GPU", "set server.cuda_mps: auto, or a model's device to gpu")
        return Plan(False, "no model runs on a GPU", *dirs)
    if shutil.which(CONTROL) is None:
        if mode == "on":
            raise UserError(
                f"server.cuda_mps is on, but {CONTROL} is not on PATH", "install the NVIDIA driver utilities, or set server.cuda_mps: auto"
            )
        return Plan(False, f"{CONTROL} is not installed", *dirs)
    if mode == "auto" and gpu_processes < 2:
        return Plan(False, "one GPU process: nothing to share", *dirs)
    return Plan(True, f"{gpu_processes} GPU processes share the GPU", *dirs)


def daemon_pids(pipe_dir: str) -> list[int]:
    """Our control daemons for `pipe_dir` (found by their command and environment: works without a pid file)."""
    found = []
    marker = f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode()
    for pid in host.pids():
        cmd = host.process_cmdline(pid) or []
        if not cmd or not cmd[0].endswith(CONTROL):
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in environ:
            found.append(pid)
    return found


def _environment(plan_: Plan) -> dict[str, str]:
    """The daemon's (and its control command's, and the probe's) environment: ours without the hub tokens, which a
    long-running process must not hold (logs.without_secrets)."""
    return {**without_secrets(os.environ), **plan_.environment}


def _control(plan_: Plan, command: str, timeout: float = 10) -> subprocess.CompletedProcess:
    env = _environment(plan_)
    return subprocess.run([CONTROL], input=command + "\n", env=env, capture_output=True, text=True, timeout=timeout, check=False)


def start(plan_: Plan) -> str:
    """Start the daemon (or reuse a running one) and prove a CUDA context can be made through it.
    Returns "" when MPS is in use, else why not (the daemon is then stopped again)."""
    if not plan_.wanted:
        return plan_.reason
    for directory in (plan_.pipe_dir, plan_.log_dir):
        Path(directory).mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
    env = _environment(plan_)
    if not daemon_pids(plan_.pipe_dir):
        started = subprocess.run([shutil.which(CONTROL) or CONTROL, "-d"], env=env, capture_output=True, text=True, timeout=30, check=False)
        if started.returncode != 0:
            return f"{CONTROL} -d failed ({started.returncode}): {(started.stderr or started.stdout).strip()[-300:]}"
        deadline = time.monotonic() + 5
        while not daemon_pids(plan_.pipe_dir) and time.monotonic() < deadline:
            time.sleep(0.05)
    try:
        probe = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60, check=False)
        problem = "" if probe.returncode == 0 else (probe.stderr.strip().splitlines() or ["no output"])[-1]
    except subprocess.TimeoutExpired:
        problem = "a CUDA context through the daemon was not made within 60 s"
    if problem:
        stop(plan_)
        return f"MPS does not work here ({problem}); see {plan_.log_dir}/control.log"
    log.info("CUDA MPS daemon ready (%s; pipe directory %s)", plan_.reason, plan_.pipe_dir)
    return ""


def stop(plan_: Plan) -> bool:
    """Ask our daemon to quit (it ends its MPS server); True when one was running."""
    pids = daemon_pids(plan_.pipe_dir) if plan_.pipe_dir else []
    if not pids:
        return False
    try:
        _control(plan_, "quit")
    except (OSError, subprocess.TimeoutExpired) as err:
        log.warning("MPS daemon did not answer quit (%s): ending it", err)
    deadline = time.monotonic() + 10
    while daemon_pids(plan_.pipe_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in daemon_pids(plan_.pipe_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return True
