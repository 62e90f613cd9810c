"""What a plain `pip install torch==VERSION` downloads from PyPI on Linux x86_64 (the CUDA build and its CUDA
libraries) next to the CPU build that hf2triton's setup picks on a host without a GPU (issue 30).

    python benchmarks/probes/torch_download.py [--version 2.13.0] [--out benchmarks/bench-2cpu/torch-download.json]

How: `pip install --isolated --dry-run --ignore-installed --report` against https://pypi.org/simple in a scratch venv
(this Python), then each chosen file's size from PyPI's JSON simple API. The CPU build's size: the wheel in a pip
find-links directory where one lies (these machines carry it; PyTorch's own index is not reachable from here).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hf2triton.torch_variant import find_links, read_table, wheel_at_hand  # noqa: E402

SIMPLE = "https://pypi.org/simple"


def file_sizes(project: str) -> dict[str, int]:
    accept = {"Accept": "application/vnd.pypi.simple.v1+json"}
    request = urllib.request.Request(f"{SIMPLE}/{project}/", headers=accept)  # noqa: S310 - the package registry
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - the package registry
        return {f["filename"]: f.get("size") or 0 for f in json.load(response)["files"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="2.13.0")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "bench-2cpu" / "torch-download.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        venv, report = Path(scratch) / "venv", Path(scratch) / "report.json"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)  # noqa: S603
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed", "--quiet"]
        subprocess.run([*pip, "--report", str(report), "--index-url", f"{SIMPLE}", f"torch=={args.version}"], check=True)  # noqa: S603
        chosen = json.loads(report.read_text())["install"]
    files, sizes = [], {}
    for item in chosen:
        project = re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower()
        name = item["download_info"]["url"].rsplit("/", 1)[1]
        sizes.setdefault(project, file_sizes(project))
        files.append({"file": name, "bytes": sizes[project].get(name, 0)})
    files.sort(key=lambda f: -f["bytes"])
    cpu = next(v for v in read_table() if v.name == "cpu")
    local = wheel_at_hand(args.version, cpu, find_links())
    result = {
        "torch": args.version,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "pypi_default": {"files": len(files), "bytes": sum(f["bytes"] for f in files), "largest": files[:8]},
        "cpu_build": {"file": local.name, "bytes": local.stat().st_size, "from": str(local.parent)} if local else None,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    default = result["pypi_default"]["bytes"]
    print(f"PyPI torch=={args.version} (Linux x86_64, CUDA build + its libraries): {len(files)} files, {default / 1e9:.2f} GB")
    if local:
        print(f"CPU build {local.name}: {local.stat().st_size / 1e9:.2f} GB ({default / local.stat().st_size:.0f}x less to download)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
