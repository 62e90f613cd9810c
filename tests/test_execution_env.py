"""Packed execution environments (hf2triton.deploy.execenv): the config parameter, and a real tritonserver that
extracts a packed venv and runs the model's stub in it."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest

from hf2triton.deploy.execenv import ENV_ARCHIVE, check_pinned, pack_execution_env, with_execution_env
from hf2triton.errors import UserError
from hf2triton.triton.modelconfig import build_model_config, config_text, read_model_config
from tests.helpers import ask_each_model

ONLY_IN_ENV = "pyjokes==0.8.3"  # a small pure-Python package that .venv does not have

PROBE_MODEL = """
import json, sys
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        try:
            import pyjokes  # noqa: F401
            from importlib.metadata import version
            found = version("pyjokes")
        except ImportError:
            found = None
        info = json.dumps({"pyjokes": found, "prefix": sys.prefix, "numpy": np.__version__})
        out = pb_utils.Tensor("text_output", np.array([[info.encode()]], dtype=np.object_))
        return [pb_utils.InferenceResponse(output_tensors=[out]) for _ in requests]
"""


def probe_config(name: str) -> str:
    return config_text(build_model_config(name, "text-generation", 0, 1, "KIND_CPU", 0, {}))


def test_with_execution_env_names_the_archive_in_the_model_directory(tmp_path):
    text = with_execution_env(probe_config("m"))
    (tmp_path / "config.pbtxt").write_text(text)
    config = read_model_config(tmp_path / "config.pbtxt")
    assert config.parameters["EXECUTION_ENV_PATH"].string_value == f"$$TRITON_MODEL_DIRECTORY/{ENV_ARCHIVE}"
    assert config.name == "m" and config.backend == "python"
    assert with_execution_env(text) == text, "applying it twice changes nothing"


@pytest.mark.parametrize("archive", ["../env.tar.gz", "/abs/env.tar.gz", "env.zip", "a/b.tar.gz", ""])
def test_with_execution_env_refuses_paths(archive):
    with pytest.raises(UserError):
        with_execution_env(probe_config("m"), archive)


def test_requirements_must_be_pinned():
    assert check_pinned(["numpy==1.26.4", " pyjokes==0.8.3 ", "uvicorn[standard]==0.30.0"])[1] == "pyjokes==0.8.3"
    for loose in (["numpy"], ["numpy>=1"], ["numpy==1.26.4", "-e ."], ["--index-url=x"], []):
        with pytest.raises(UserError):
            check_pinned(loose)
    with pytest.raises(UserError, match="numpy"):
        pack_execution_env([ONLY_IN_ENV], "/nonexistent/env.tar.gz")


@pytest.mark.integration
def test_packed_env_runs_the_stub_in_a_fresh_tritonserver(tmp_path):
    """A model whose config names the packed archive imports a package only the archive has (and the env's own
    sys.prefix); the same model without it does not. This machine's stub is this Python's version, so the env is
    built with (and points at) this Python's base interpreter; the container's is built the same way with 3.10."""

    base = str(Path(sys._base_executable).resolve())
    numpy_pin = f"numpy=={metadata.version('numpy')}"
    for name in ("inenv", "plain"):
        (tmp_path / "repo" / name / "1").mkdir(parents=True)
        (tmp_path / "repo" / name / "1" / "model.py").write_text(PROBE_MODEL)
        config = probe_config(name)
        if name == "inenv":
            archive = pack_execution_env([numpy_pin, ONLY_IN_ENV], tmp_path / "repo" / name / ENV_ARCHIVE, python=base, target_python=base)
            config = with_execution_env(config)
        (tmp_path / "repo" / name / "config.pbtxt").write_text(config)
    assert archive.stat().st_size > 1_000_000
    answers = ask_each_model(tmp_path / "repo", tmp_path / "work", ["inenv", "plain"])
    assert answers["inenv"]["pyjokes"] == "0.8.3"
    assert answers["inenv"]["prefix"].startswith("/tmp/python_env_"), "the stub ran in the backend's extracted copy"
    assert answers["inenv"]["numpy"] == metadata.version("numpy")
    assert answers["plain"]["pyjokes"] is None and not answers["plain"]["prefix"].startswith("/tmp/python_env_")
