"""What a package on the path costs every process of a kind (why the test environment leaves two out of .venv).

- `--case scikit-learn` (the default): transformers imports sklearn.metrics (with scipy.stats and pandas) from
  transformers.generation once scikit-learn is importable; lm-eval pulls it into the test environment, and each Triton
  stub, validation and export the suite starts loads a model. The process: a tiny BERT loaded; the package: installed
  into a temporary folder (--no-deps: its dependencies stay in .venv).
- `--case slurm-plugin`: snakemake imports every executor plugin it finds at start, and snakemake-executor-plugin-slurm
  imports pandas; the suite starts hundreds of snakemake runs. The process: `snakemake -n status` in the project; the
  package: the folder `make test` installs it into (.venv/slurm-plugins, envs/slurm-plugin.txt).

Fresh processes alternately with the folder on PYTHONPATH and without it; wall and CPU seconds per process and their
medians side by side (the machine's speed drifts: only the interleaved ratio means something).

    .venv/bin/python benchmarks/probes/import_cost.py --rounds 5
    .venv/bin/python benchmarks/probes/import_cost.py --case slurm-plugin --rounds 7
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOAD = "from transformers import AutoModel; AutoModel.from_pretrained({path!r})"


def tiny_bert(directory: Path) -> Path:
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    BertModel(config).save_pretrained(directory)
    return directory


def run_once(command: list[str], extra_path: str | None) -> tuple[float, float]:
    """(wall, CPU) seconds of one fresh process running `command` in the project."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if extra_path:
        env["PYTHONPATH"] = extra_path
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True, cwd=ROOT)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def prepare(case: str, tmp: Path, scikit_learn: str) -> tuple[list[str], str, str]:
    """(the process's command, the folder to put on the path, the package's name) for `case`."""
    if case == "slurm-plugin":
        folder = Path(sys.executable).parent.parent / "slurm-plugins"
        if not folder.is_dir():
            raise SystemExit(f"{folder} is missing: make .venv/.installed-test installs it")
        return [str(Path(sys.executable).parent / "snakemake"), "-n", "--cores", "1", "status"], str(folder), "the SLURM plugin"
    model = tiny_bert(tmp / "tiny-bert")
    target = tmp / "sklearn"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), scikit_learn], check=True)
    return [sys.executable, "-c", LOAD.format(path=str(model))], str(target), "scikit-learn"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=("scikit-learn", "slurm-plugin"), default="scikit-learn")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scikit-learn", default="scikit-learn==1.9.1", help="the version lm-eval 0.4.13 pulled in")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        command, folder, package = prepare(args.case, Path(tmp), args.scikit_learn)
        arms = {f"without {package}": None, f"with {package}": folder}
        figures: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms}
        for round_ in range(args.rounds):
            order = list(arms) if round_ % 2 == 0 else list(reversed(arms))
            for arm in order:
                figures[arm].append(run_once(command, arms[arm]))
                print(f"round {round_}: {arm:24s} wall {figures[arm][-1][0]:5.2f} s, CPU {figures[arm][-1][1]:5.2f} s", flush=True)
    medians = {arm: (statistics.median(w for w, _ in f), statistics.median(c for _, c in f)) for arm, f in figures.items()}
    for arm, (wall, cpu) in medians.items():
        print(f"{arm:24s} median wall {wall:5.2f} s, CPU {cpu:5.2f} s")
    (wall_without, cpu_without), (wall_with, cpu_with) = medians.values()
    extra = cpu_with - cpu_without
    print(f"with ÷ without: wall {wall_with / wall_without:.2f}x, CPU {cpu_with / cpu_without:.2f}x (+{extra:.2f} s CPU per process)")


if __name__ == "__main__":
    main()
