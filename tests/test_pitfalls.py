"""Failure hints match their cause and suggest commands that work: the shared-memory hint fired on the
backend table every Triton log prints (so a missing model.py was blamed on shared memory), and a fix said
`snakemake lint`, which fails ("Target rules may not contain wildcards")."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from hf2triton.specs import ServerSpec
from hf2triton.triton import pitfalls
from hf2triton.triton.pitfalls import COMMANDS, PITFALLS, explain
from hf2triton.triton.process import _failure
from hf2triton.triton.settings import Settings
from tests.helpers import ROOT

# What tritonserver logs when 1/model.py is missing and it gives up (lines of a real run: the stub's error,
# then the model and backend tables printed on exit; the backend table names shm-default-byte-size).
MISSING_MODEL_PY_LOG = "\n".join(
    [
        'W1130 12:04:07.505194 29129 pinned_memory_manager.cc:273] "Unable to allocate pinned system memory, pinned memory pool '
        'will not be available: CUDA driver version is insufficient for CUDA runtime version"',
        'E1130 12:04:07.505325 29129 server.cc:241] "CudaDriverHelper has not been initialized."',
        'I1130 12:04:07.506401 29129 model_lifecycle.cc:472] "loading: nofile:1"',
        "I1130 12:04:07.527735 29137 pb_stub.cc:2105]  Failed to preinitialize Python stub: "
        "Python model file not found in '/p/model_repository/nofile/1/model.py'",
        "E1130 12:04:37.869397 29129 model_lifecycle.cc:642] \"failed to load 'nofile' version 1: "
        "Internal: Stub process 'nofile_0_0' is not healthy.\"",
        "I1130 12:04:37.869440 29129 model_lifecycle.cc:777] \"failed to load 'nofile'\"",
        '| python  | /p/.hf2triton/server/backends/python/libtriton_python.so | {"cmdline":{"auto-complete-config":"true",'
        '"backend-directory":"/p/.hf2triton/server/backends","min-compute-capability":"6.000000",'
        '"shm-default-byte-size":"16777216","default-max-batch-size":"4"}} |',
        "| nofile | 1       | UNAVAILABLE: Internal: Stub process 'nofile_0_0' is not healthy. |",
        "error: creating server: Invalid argument - load failed for model 'nofile': version 1 is at UNAVAILABLE state: "
        "Internal: Stub process 'nofile_0_0' is not healthy.",
    ]
)
SHM_LOG_LINE = (
    "E1130 12:00:00.000000 1 python_be.cc:1000] \"Unable to initialize shared memory key 'triton_python_backend_shm_region_1' "
    "to requested size (1048576 bytes). If you are running Triton inside docker, use '--shm-size' flag to control the shared "
    'memory region size. Each Python backend model instance requires at least 1 MB of shared memory. Error: No space left on device"'
)


def failure_message(tmp_path: Path, log: str) -> str:
    settings = Settings.of(ServerSpec(), ["nofile"], str(tmp_path / "work"), str(tmp_path / "repo"))
    settings.log_file.parent.mkdir(parents=True)
    settings.log_file.write_text(log)
    return _failure(settings, "tritonserver exited with status 1 during startup").render()


def test_missing_model_py_is_named_and_not_blamed_on_shared_memory(tmp_path):
    message = failure_message(tmp_path, MISSING_MODEL_PY_LOG)
    assert "1/model.py missing" in message and f"`{pitfalls.RENDER}`" in message, message
    assert "shared memory" not in message and "shm" not in message, message
    assert "stub process died" not in message, "the generic consequence is left out when the cause is known"


def test_generic_hints_only_without_a_specific_one():
    died = "E1130 model_lifecycle.cc:642] \"failed to load 'm' version 1: Internal: Stub process 'm_0_0' is not healthy.\""
    assert {p.cause for p in explain(died)} == {"a Python-backend stub process died", "a model failed to load"}
    assert [p.cause for p in explain(died + "\nModuleNotFoundError: No module named 'x'")] == [
        "model.py imports a package the stub's Python lacks"
    ]


def test_shared_memory_hint_needs_tritons_own_words(tmp_path):
    backend_table = MISSING_MODEL_PY_LOG.splitlines()[6]
    assert "shm-default-byte-size" in backend_table
    assert not [p for p in explain(backend_table) if "shared memory" in p.cause]
    assert [p for p in explain(SHM_LOG_LINE) if "shared memory" in p.cause]
    assert "raise server.shm_default_byte_size" in failure_message(tmp_path, SHM_LOG_LINE)


def test_no_message_or_document_suggests_snakemake_lint():
    """`snakemake lint` fails: the rule `lint` has wildcards (the repository lint is `python -m hf2triton lint`)."""
    assert not [p.fix for p in PITFALLS if "snakemake lint" in p.fix]
    sources = [ROOT / "README.md", ROOT / "Makefile", *(ROOT / "hf2triton").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]
    found = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for path in sources
        for line in path.read_text().splitlines()
        if "snakemake lint" in line
    ]
    assert found == []


def suggested_commands() -> set[str]:
    return {command for p in PITFALLS for command in re.findall(r"`([^`]+)`", p.fix)}


def test_every_command_a_hint_suggests_is_a_known_one():
    assert suggested_commands() <= set(COMMANDS), suggested_commands() - set(COMMANDS)
    assert suggested_commands(), "the hints suggest commands in backticks"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_suggested_command_works(command):
    """Run as written, from the project directory: make targets as a dry run (-n), the lint for real."""
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv in the project directory")
    if command.startswith("make "):
        result = subprocess.run(["make", "-n", *command.split()[1:]], cwd=ROOT, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
        return
    result = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, text=True, check=False)  # noqa: S602 - our constant
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 1: findings; argparse/usage errors are 2
    assert "usage:" not in result.stderr and "Traceback" not in result.stderr, result.stderr
