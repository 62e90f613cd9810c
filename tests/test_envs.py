"""The conda environment file carries exactly the pins the Makefile installs."""

from __future__ import annotations

from pathlib import Path

import yaml

ENVS = Path(__file__).resolve().parent.parent / "envs"


def pins(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def test_conda_env_equals_requirements():
    env = yaml.safe_load((ENVS / "hf2triton.yaml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pip_section == pins(ENVS / "requirements.txt")


def test_every_requirement_is_pinned_exactly():
    for path in ("requirements.txt", "models.txt", "xgrammar.txt", "test.txt", "slurm-plugin.txt", "hub-mirror.txt", "docs.txt"):
        for line in pins(ENVS / path):
            assert "==" in line, f"{path}: {line} is not pinned"


def test_numpy_below_2_for_the_triton_stub():
    """Serving's numpy, and the same pin in the test environment (whose tools would otherwise upgrade it: pandas 3)."""
    numpy = [p for p in pins(ENVS / "requirements.txt") if p.startswith("numpy==")]
    assert len(numpy) == 1 and numpy[0].startswith("numpy==1.")
    assert numpy[0] in pins(ENVS / "test.txt")
    import numpy as installed

    assert numpy[0] == f"numpy=={installed.__version__}", "the environment the tests run in has serving's numpy"


def test_makefile_targets_parse():
    import subprocess

    root = ENVS.parent
    for target in ("serve", "test", "test-fast", "lint", "docs", "stop", "status", "dry-run", "soak", "bench", "tune", "clean"):
        result = subprocess.run(["make", "-n", "-C", str(root), target], capture_output=True, text=True, check=False)
        assert result.returncode == 0, (target, result.stderr)
    status = subprocess.run(["make", "-n", "-C", str(root), "status"], capture_output=True, text=True, check=False).stdout
    assert "status --quiet all" in status, "targets must come before --quiet (it takes several values)"


def test_models_load_in_the_tests_as_in_serving_without_scikit_learn():
    """Once scikit-learn is importable, transformers imports sklearn.metrics (scipy.stats, pandas) in every process
    that loads a model: 3.5 s of CPU per Triton stub and validation run (benchmarks/probes/import_cost.py).
    requirements.txt has none; the Makefile removes the copy lm-eval pulls into the test environment."""
    import importlib.util

    assert not any(line.lower().startswith("scikit-learn") for line in pins(ENVS / "requirements.txt"))
    assert importlib.util.find_spec("sklearn") is None, "scikit-learn is installed: `make .venv/.installed-test` uninstalls it"
