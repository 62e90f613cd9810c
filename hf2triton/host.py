"""Facts about the machine: GPU presence, boot id, free ports, available memory, CPU count."""

from __future__ import annotations

import glob
import importlib.util
import os
import random
import runpy
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any


def has_gpu() -> bool:
    """An NVIDIA GPU the server could use (device node or a working nvidia-smi); cheap, no torch import."""
    if os.environ.get("HF2TRITON_ASSUME_NO_GPU") == "1":
        return False
    if glob.glob("/dev/nvidia[0-9]*"):
        return True
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        result = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and "GPU" in result.stdout


def gpu_name() -> str:
    """The first GPU's name from nvidia-smi (no torch import), or "none"."""
    return _first_gpu("name")


def driver_version() -> str:
    """The NVIDIA driver's version from nvidia-smi, or "none"."""
    return _first_gpu("driver_version")


def query_gpus(fields: str, units: bool = True) -> list[list[str]] | None:
    """`nvidia-smi --query-gpu=FIELDS` as one list of values per GPU; None without a working nvidia-smi (or with
    HF2TRITON_ASSUME_NO_GPU=1). Standard library only: hf2triton.torch_variant runs before the venv exists."""
    smi = shutil.which("nvidia-smi")
    if os.environ.get("HF2TRITON_ASSUME_NO_GPU") == "1" or not smi:
        return None
    query = [smi, f"--query-gpu={fields}", "--format=csv,noheader" + ("" if units else ",nounits")]
    try:
        result = subprocess.run(query, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    return [[value.strip() for value in line.split(",")] for line in result.stdout.strip().splitlines() if line.strip()]


def _first_gpu(field: str) -> str:
    """nvidia-smi's `field` of the first GPU: "none" without a GPU, "unknown" where nvidia-smi fails."""
    if not has_gpu():
        return "none"
    rows = query_gpus(field)
    return rows[0][0] if rows else "unknown"


def torch_facts() -> dict[str, object]:
    """torch as installed (hf2triton.torch_variant chose its build) and whether CUDA works with it here: version,
    its CUDA build ("cpu" for the CPU build), the driver, cuda_works and, when a GPU is there but CUDA does not
    work, torch's own reason. Imports torch (seconds) only where a GPU is: without one CUDA cannot work, and the
    version and build are read from torch's own version module (status and validation run on every serve)."""
    driver = driver_version()
    if driver == "none":
        version = _torch_version_module()
        return {"version": version["__version__"], "cuda_build": version["cuda"] or "cpu", "driver": driver, "cuda_works": False}
    import torch

    facts: dict[str, object] = {"version": torch.__version__, "cuda_build": torch.version.cuda or "cpu", "driver": driver}
    facts["cuda_works"] = bool(torch.version.cuda) and torch.cuda.is_available()
    if facts["driver"] != "none" and not facts["cuda_works"]:
        if not torch.version.cuda:
            facts["reason"] = "torch is the CPU build"
        else:
            try:
                torch.cuda.init()
            except Exception as err:  # noqa: BLE001 - torch's reason is the message
                facts["reason"] = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            else:
                facts["reason"] = "torch.cuda.is_available() is False"
    return facts


def _torch_version_module() -> dict[str, Any]:
    """torch/version.py run alone (torch writes it at build time: `__version__`, `cuda`), not the whole package."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'torch'")
    return runpy.run_path(str(Path(spec.submodule_search_locations[0]) / "version.py"))


def describe_torch(facts: dict[str, object]) -> str:
    """One line: torch 2.13.0+cu130 (CUDA 13.0), driver 580.95.05, CUDA works."""
    build = "CPU build" if facts["cuda_build"] == "cpu" else f"CUDA {facts['cuda_build']}"
    works = "CUDA works" if facts["cuda_works"] else f"CUDA not used: {facts.get('reason', 'no NVIDIA GPU')}"
    return f"torch {facts['version']} ({build}), driver {facts['driver']}, {works}"


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def port_is_free(host: str, port: int) -> bool:
    """True if we could bind `port` on `host` now (what tritonserver will do)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of source ports for outgoing connections (Linux's default where it cannot be read)."""
    try:
        low, high = (int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, for a server that binds it later. Drawn at random below the kernel's ephemeral range: a port
    the kernel hands out for bind(0) comes from that range, where any outgoing connection meanwhile (a client of
    another server of the same machine) may take it as its source port before the server binds it (CI saw the
    gateway's port so taken). The kernel's bind(0) where nothing below the range is free."""
    low, _ = ephemeral_ports()
    below = range(max(1024, low - 12000), low)
    for port in random.sample(below, min(64, len(below))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def free_ports(count: int = 3, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct free ports, ascending (e.g. HTTP, gRPC, metrics of a scratch server)."""
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port(host))
    return sorted(ports)


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (what new processes can use without swapping)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def process_cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (field 3 onwards), None if the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_state(pid: int) -> str | None:
    """The one-letter state of `pid` (R, S, D, T stopped, t traced, Z ...), None if it is gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def process_gone(pid: int) -> bool:
    """`pid` has ended: no such process, or a zombie (its parent has not waited for it yet; its command line is
    empty). A zombie keeps its pid until then, so that pid is not reused meanwhile."""
    return process_state(pid) in (None, "Z", "X")


def process_group(pid: int) -> int | None:
    """The process group of `pid` (None if it is gone)."""
    fields = _stat_fields(pid)
    return int(fields[2]) if fields else None


def parent_pid(pid: int) -> int | None:
    """The parent of `pid` (None if it is gone)."""
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time `pid` has used so far (None if it is gone)."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else None


def pids() -> list[int]:
    """Every process this user can see, from /proc."""
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def descendants(pid: int) -> list[int]:
    """All live descendants of `pid` (children, grandchildren, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for child in pids():
        parent = parent_pid(child)
        if parent is not None:
            children.setdefault(parent, []).append(child)
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def process_rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def gpu_count() -> int:
    """The NVIDIA GPUs nvidia-smi lists (0 without a working nvidia-smi)."""
    return len(query_gpus("index") or [])


def gpu_memory_table() -> list[tuple[int, int]] | None:
    """(free, total) bytes of each GPU, by index, as nvidia-smi reports them (None without a working nvidia-smi)."""
    rows = query_gpus("memory.free,memory.total", units=False)
    try:
        return [(int(free) * 1024**2, int(total) * 1024**2) for free, total in rows] if rows else None
    except ValueError:
        return None


def gpu_memory_of(pids: list[int]) -> int:
    """GPU memory the processes `pids` hold, from nvidia-smi's compute apps (0 where it cannot tell)."""
    smi = shutil.which("nvidia-smi")
    if not smi or not pids:
        return 0
    try:
        query = [smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
        result = subprocess.run(query, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    wanted, total = set(pids), 0
    for line in result.stdout.splitlines() if result.returncode == 0 else []:
        pid, _, used = line.partition(",")
        if pid.strip().isdigit() and int(pid) in wanted and used.strip().isdigit():
            total += int(used) * 1024**2
    return total
