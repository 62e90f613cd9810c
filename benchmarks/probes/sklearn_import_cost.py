"""What scikit-learn's presence costs every process that loads a model (why the test environment has none).

transformers imports sklearn.metrics (with scipy.stats and pandas) from transformers.generation once scikit-learn is
importable; lm-eval pulls it into the test environment, and each Triton stub, validation and export the suite starts
loads a model. This loads a tiny BERT in fresh processes, alternately with scikit-learn on the path (installed into a
temporary folder, --no-deps: its dependencies stay in .venv) and without it, and prints wall and CPU seconds per
process and their medians side by side (the machine's speed drifts: only the interleaved ratio means something).

    .venv/bin/python benchmarks/probes/sklearn_import_cost.py --rounds 5
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

LOAD = "from transformers import AutoModel; AutoModel.from_pretrained({path!r})"


def tiny_bert(directory: Path) -> Path:
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    BertModel(config).save_pretrained(directory)
    return directory


def load_once(model: Path, extra_path: str | None) -> tuple[float, float]:
    """(wall, CPU) seconds of one fresh process loading `model`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if extra_path:
        env["PYTHONPATH"] = extra_path
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", LOAD.format(path=str(model))], env=env, check=True, capture_output=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scikit-learn", default="scikit-learn==1.9.1", help="the version lm-eval 0.4.13 pulled in")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_bert(Path(tmp) / "tiny-bert")
        target = Path(tmp) / "sklearn"
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), args.scikit_learn]
        subprocess.run(pip, check=True)
        arms = {"without scikit-learn": None, "with scikit-learn": str(target)}
        figures: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms}
        for round_ in range(args.rounds):
            order = list(arms) if round_ % 2 == 0 else list(reversed(arms))
            for arm in order:
                figures[arm].append(load_once(model, arms[arm]))
                print(f"round {round_}: {arm:21s} wall {figures[arm][-1][0]:5.2f} s, CPU {figures[arm][-1][1]:5.2f} s", flush=True)
    medians = {arm: (statistics.median(w for w, _ in f), statistics.median(c for _, c in f)) for arm, f in figures.items()}
    for arm, (wall, cpu) in medians.items():
        print(f"{arm:21s} median wall {wall:5.2f} s, CPU {cpu:5.2f} s")
    (wall_without, cpu_without), (wall_with, cpu_with) = medians.values()
    extra = cpu_with - cpu_without
    print(f"with ÷ without: wall {wall_with / wall_without:.2f}x, CPU {cpu_with / cpu_without:.2f}x (+{extra:.2f} s CPU per process)")


if __name__ == "__main__":
    main()
