"""Issue 10's cases on the shipped config (real models, the real `make` targets), timed: what each costs
the user and that the old server keeps serving where it should. Run with the server up (`make serve`):

    .venv/bin/python benchmarks/never_break.py --out benchmarks/bench-2cpu/never-break.json

Cases: a no-op `make serve`; the server killed with SIGKILL (restore); a deleted `1/model.py` and a
truncated `model.safetensors` (rebuilt before they are served; minilm answers meanwhile); a `server.host`
this machine does not have (refused, the old server serves); an oversized request to minilm (refused at
once). Each line says whether the server process was kept. 2-core CPU: the requests and `make` share it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tritonclient.http as httpclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from hf2triton.config import load_project  # noqa: E402
from hf2triton.triton import client  # noqa: E402
from hf2triton.triton.settings import Settings  # noqa: E402
from hf2triton.triton.state import read_state  # noqa: E402


def make(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    began = time.perf_counter()
    done = subprocess.run(["make", *args], cwd=ROOT, capture_output=True, text=True, check=False)  # noqa: S603,S607 - our Makefile
    return round(time.perf_counter() - began, 1), done


def embeds(url: str) -> bool:
    try:
        result = client.http_client(url).infer("minilm", client.build_inputs(httpclient, ["still serving"]))
        return result.as_numpy("embedding").shape[0] == 1
    except InferenceServerException:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    project = load_project(ROOT / "config.yaml")
    settings = Settings.of(project.server, project.names, str(ROOT / project.work), "model_repository")
    url = settings.url()
    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    def record(case: str, seconds: float, done: subprocess.CompletedProcess, pid_before: int, **extra) -> None:
        state = read_state(settings) or {}
        row = {"case": case, "seconds": seconds, "exit": done.returncode, "server_kept": state.get("pid") == pid_before, **extra}
        ours = [line for line in done.stderr.splitlines() if line.startswith("hf2triton")] or [""]
        serving = [line for line in ours if line.startswith("hf2triton: serving")]
        row["said"] = (serving or ours)[-1][:240]  # what the user reads: the server decision, or the error
        emit(row)

    _, done = make("serve")
    assert done.returncode == 0, done.stderr[-2000:]
    pid = read_state(settings)["pid"]
    seconds, done = make("serve")
    record("no-op make serve", seconds, done, pid)

    os.kill(pid, signal.SIGKILL)
    time.sleep(1)
    seconds, done = make("serve")
    record("tritonserver killed (SIGKILL) -> make serve", seconds, done, pid, serving=embeds(url))

    pid = read_state(settings)["pid"]
    (ROOT / "model_repository" / "minilm" / "1" / "model.py").unlink()
    _, dry = make("dry-run")
    forced = "Forced execution" in dry.stdout
    seconds, done = make("serve")
    record("deleted minilm/1/model.py -> make serve", seconds, done, pid, dry_run_forced=forced, serving=embeds(url))

    weights = ROOT / project.work / "models" / "minilm" / "pretrained" / "model.safetensors"
    size = weights.stat().st_size
    os.truncate(weights, size // 2)
    seconds, done = make("serve")
    record("truncated minilm weights -> make serve", seconds, done, pid, restored=weights.stat().st_size == size, serving=embeds(url))

    overlay = ROOT / "results" / "never-break-host.yaml"
    overlay.write_text("server: {host: 203.0.113.7}\n")
    try:
        seconds, done = make("serve", f"OVERLAY={overlay}")
        record("server.host not on this machine -> make serve", seconds, done, pid, serving_during=embeds(url))
    finally:
        overlay.unlink()

    http = client.http_client(url)
    began = time.perf_counter()
    try:
        http.infer("minilm", client.build_inputs(httpclient, ["a sentence of a few words"] * 2000))
        refused = ""
    except InferenceServerException as err:
        refused = str(err)[:120]
    emit({"case": "minilm, one request of 2,000 texts", "seconds": round(time.perf_counter() - began, 3), "refused": refused})

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    measured_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    Path(args.out).write_text(json.dumps({"rows": rows, "measured_at": measured_at}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
