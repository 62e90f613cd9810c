"""Where a command's CPU goes, by kind of process: runs it and samples every process's CPU time in /proc (4 times a
second) until it ends, then prints the seconds per kind (Triton stubs per model, each Snakemake script, snakemake
itself, tritonserver, the gateway, pytest) -- what showed that the suite's time is processes importing torch and
transformers, and scikit-learn's share of it (import_cost.py).

    .venv/bin/python benchmarks/probes/suite_cpu_by_process.py --out cpu.txt -- \\
        .venv/bin/python -m pytest -n 2 --dist loadfile -q tests/test_never_break.py tests/test_workflow.py

A process that lives less than a sample's interval is missed; every process on the machine is counted.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import time
from collections import defaultdict
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def kind(command: str) -> str:
    if command.split(" ")[0].endswith("tritonserver"):
        return "tritonserver"
    if "triton_python_backend_stub" in command:
        model = re.search(r"/([^/ ]+)/\d+/model\.py", command)
        return "stub:" + (model.group(1) if model else "?")
    script = re.search(r"\.snakemake/scripts/tmp[^.]*\.(\w+)\.py", command)
    if script:
        return "script:" + script.group(1)
    for word in ("snakemake", "hf2triton.gateway", "pytest", "xdist", "execnet"):
        if word in command:
            return word
    return " ".join(os.path.basename(part) for part in command.split(" ")[:2])[:60]


def sample(seen: dict[tuple[str, str], list]) -> None:
    """Every process's CPU seconds so far, keyed by (pid, start time): a reused pid is another process."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rfind(")") + 2 :].split()
            cpu = (int(fields[11]) + int(fields[12])) / TICK
            key = (pid, fields[19])
            if key not in seen:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if command:
                    seen[key] = [kind(command), cpu]
            else:
                seen[key][1] = cpu
        except (OSError, IndexError, ValueError):
            pass  # gone between listing and reading


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("command", nargs="+", help="the command to run and measure (after --)")
    args = parser.parse_args()
    seen: dict[tuple[str, str], list] = {}
    sample(seen)
    before = {key: cpu for key, (_, cpu) in seen.items()}  # processes already running count from now on
    started = time.monotonic()
    process = subprocess.Popen(args.command)
    while process.poll() is None:
        sample(seen)
        time.sleep(0.25)
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for key, (name, cpu) in seen.items():
        if cpu > before.get(key, 0.0):
            totals[name] += cpu - before.get(key, 0.0)
            counts[name] += 1
    lines = [f"{cpu:9.1f} s {counts[name]:5d} processes  {name}" for name, cpu in sorted(totals.items(), key=lambda kv: -kv[1])]
    lines.append(f"{sum(totals.values()):9.1f} s CPU in all, {time.monotonic() - started:.0f} s wall, exit {process.returncode}")
    # the busiest single processes: how evenly several stubs of one model (vllm.frontends) share the work
    each = sorted(((cpu - before.get(key, 0.0), key[0], name) for key, (name, cpu) in seen.items()), reverse=True)
    lines += ["busiest processes:"] + [f"{cpu:9.1f} s  pid {pid:>7}  {name}" for cpu, pid, name in each[:12] if cpu >= 0.5]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:25]))


if __name__ == "__main__":
    main()
