"""Facts about the machine: GPU presence, boot id, free ports, available memory, CPU count."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
from pathlib import Path


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
    smi = shutil.which("nvidia-smi")
    if not smi or not has_gpu():
        return "none"
    try:
        result = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    names = result.stdout.strip().splitlines()
    return names[0].strip() if result.returncode == 0 and names else "unknown"


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


def free_port(host: str = "127.0.0.1") -> int:
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


def gpu_free_memory_bytes() -> int | None:
    """Free memory of GPU 0 as nvidia-smi reports it (None without a working nvidia-smi)."""
    return _gpu_memory("memory.free")


def gpu_total_memory_bytes() -> int | None:
    """All memory of GPU 0 (what vLLM's gpu_memory_utilization is a fraction of)."""
    return _gpu_memory("memory.total")


def _gpu_memory(field: str) -> int | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        result = subprocess.run(
            [smi, f"--query-gpu={field}", "--format=csv,noheader,nounits", "--id=0"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return int(result.stdout.strip().splitlines()[0]) * 1024**2 if result.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
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
