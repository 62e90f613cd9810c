"""Legal but unusable paths, with the real workflow: refused before any work (no step runs), naming the path
and the fix. Why they cannot work: Snakemake runs each step as `<python> <script>` with the Python's path
unquoted; Triton starts each Python-backend stub as `bash -c "exec <stub> <model path> ..."` (unquoted) with
an LD_PRELOAD that splits on spaces and colons; and the stub embeds Python with an isolated config that reads
file names as ASCII whatever LANG/LC_ALL say ("UnicodeEncodeError: 'ascii' codec" once the build is done)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import make_workflow, tiny_model_entries

pytestmark = pytest.mark.integration
FIX = "fix: move the project to a directory without spaces, colons, shell metacharacters or non-ASCII characters"


def embed_only(tiny_models) -> list[dict]:
    return tiny_model_entries({"feature-extraction": tiny_models["feature-extraction"]})


def refused(workflow, result) -> str:
    text = result.stdout + result.stderr
    assert result.returncode != 0, text[-3000:]
    assert workflow.jobs_run(result) == [], "refused before any step ran"
    assert not (workflow.directory / "model_repository").exists() and not workflow.work.exists()
    assert "Traceback" not in text
    return text


@pytest.mark.parametrize("name,problem", [("my project", "contains a space"), ("projekt-é", "contains non-ASCII characters")])
def test_project_directory_that_cannot_be_served_from_is_refused_before_any_work(tmp_path, tiny_models, name, problem):
    """A space failed the first step ("bash: /tmp/my: No such file or directory" after the install)."""
    workflow = make_workflow(tmp_path / name, embed_only(tiny_models))
    started = time.monotonic()
    text = refused(workflow, workflow.run("serve", check=False, timeout=300))
    assert f"hf2triton: error: the project directory {workflow.directory} {problem}" in text, text[-3000:]
    assert FIX in text, text[-3000:]
    assert time.monotonic() - started < 60


def test_python_with_a_space_in_its_path_is_refused_before_any_work(tmp_path, tiny_models):
    """A .venv under a directory with a space: Snakemake put its unquoted path in every step's command."""
    venv = tmp_path / "my venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = next((venv / "lib").glob("python*/site-packages"))
    (purelib / "hf2triton-test.pth").write_text(str(Path(np.__file__).parent.parent) + "\n")  # this .venv's packages
    workflow = make_workflow(tmp_path / "project", embed_only(tiny_models))
    command = [str(venv / "bin" / "python"), "-m", "snakemake", *workflow.command("serve")[1:]]
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=workflow.directory, env=workflow.environment(), timeout=300, check=False
    )
    text = refused(workflow, result)
    assert f"hf2triton: error: the Python of this run, {venv}/bin/python, contains a space" in text, text[-3000:]
    assert FIX in text


def test_non_ascii_work_directory_is_refused_before_any_work(tmp_path, tiny_models):
    """paths.work = "werk-é" built everything, then the server failed (the stub's Python: ASCII file names)."""
    workflow = make_workflow(tmp_path / "project", embed_only(tiny_models))
    workflow.config["paths"]["work"] = "werk-é"
    text = refused(workflow, workflow.run("serve", check=False, timeout=300))
    assert "hf2triton: error: config.paths.work = 'werk-é': contains non-ASCII characters" in text, text[-3000:]
    assert "fix: choose an ASCII path of letters, digits and _ . / - only" in text
