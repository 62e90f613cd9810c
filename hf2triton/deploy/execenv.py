"""A Python model's packages inside the official Triton container: a packed execution environment.

The official image has Triton's Python backend but not torch or transformers. Its per-model execution environment
(`EXECUTION_ENV_PATH`) carries them: a `.tar.gz` in the model directory that the backend extracts (libarchive, modes
and symlinks kept: what object storage would lose on a plain directory) and then runs the stub under
`source <env>/bin/activate` (python_backend src/stub_launcher.cc, Triton 24.10). The stub is an embedded interpreter:
it finds the first `python3` on PATH (the env's), reads the pyvenv.cfg next to it and so imports the env's
site-packages on top of its own standard library. Hence the env's Python must be the stub's major.minor (24.10:
3.10, the Ubuntu 22.04 python; this wheel has a stub per version) and its `bin/python3.X` must resolve on the
machine that runs it.

`pack_execution_env` builds a venv from pinned requirements and packs it with venv-pack (its `bin/activate` finds
the env from its own location, so the extracted copy works wherever the backend puts it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from hf2triton.errors import UserError
from hf2triton.triton.modelconfig import EXECUTION_ENV_PATH, config_text

# The official 24.10 container (Ubuntu 22.04): its stub's Python and where that Python lives
STUB_PYTHON = "python3.10"  # builds its env here (same major.minor)
CONTAINER_PYTHON = "/usr/bin/python3.10"
ENV_ARCHIVE = "python_env.tar.gz"  # in the model directory, next to config.pbtxt (the backend's README layout)
PINNED = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!_-]+$")
ARCHIVE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.tar\.gz$")


def python_version(interpreter: str) -> str:
    """'3.10' for a python3.10 interpreter."""
    probe = [interpreter, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]
    result = subprocess.run(probe, capture_output=True, text=True, check=False)  # noqa: S603
    if result.returncode != 0:  # e.g. a pyenv shim of a version not selected
        raise UserError(f"cannot run {interpreter}: {result.stderr.strip()[:200]}", "give the path of a working python3.10 (python=...)")
    return result.stdout.strip()


def check_pinned(requirements: Sequence[str]) -> list[str]:
    """The requirements, each `name==version` (an archive rebuilt later must hold the same packages)."""
    loose = [r for r in requirements if not PINNED.match(r.strip())]
    if loose or not requirements:
        raise UserError(
            f"execution environment requirements must be pinned (name==version): {', '.join(loose) or 'none given'}",
            "pin every package, e.g. numpy==1.26.4",
        )
    return [r.strip() for r in requirements]


def retarget(env: Path, target_python: str) -> None:
    """Point the venv's interpreter links and pyvenv.cfg at `target_python`, the interpreter of the machine that will
    run it. Done here rather than with venv-pack's --python-prefix: venv-pack 0.2.0 mangles a modern venv's link
    (observed: bin/python3.11 -> /usr/bin/python3.113.11)."""
    links = [p for p in sorted((env / "bin").glob("python*")) if p.is_symlink() and Path(p.readlink()).is_absolute()]
    if not links:
        raise UserError(f"{env} has no bin/python* link to its base interpreter", "build it with `python -m venv`")
    for link in links:
        link.unlink()
        link.symlink_to(target_python)
    moved = {"home": str(Path(target_python).parent), "executable": target_python}
    lines = (env / "pyvenv.cfg").read_text().splitlines()
    kept = [line for line in lines if line.split("=", 1)[0].strip() not in (*moved, "command")]
    (env / "pyvenv.cfg").write_text("\n".join([*(f"{k} = {v}" for k, v in moved.items()), *kept]) + "\n")


def pack_execution_env(
    requirements: Sequence[str], output: Path | str, python: str = STUB_PYTHON, target_python: str = CONTAINER_PYTHON
) -> Path:
    """Build a venv of `python` (an interpreter of the stub's major.minor; default: python3.10 on PATH, as the 24.10
    container's stub) holding the pinned `requirements` (wheels only: nothing compiled here that the target cannot
    load), point it at `target_python` (the interpreter where the server runs: the container's by default; this
    machine's for a local server) and write the archive `output` (.tar.gz). numpy must be among the requirements:
    triton_python_backend_utils imports it from the env (and the 24.10 stub needs numpy < 2)."""
    import venv_pack

    pins = check_pinned(requirements)
    if not any(re.match(r"^numpy(\[.*\])?==", pin, re.IGNORECASE) for pin in pins):
        raise UserError("the execution environment has no numpy pin (the backend's utilities import it)", "add numpy==1.26.4")
    output = Path(output)
    if not output.name.endswith(".tar.gz"):
        raise UserError(f"{output}: the Python backend extracts only .tar.gz execution environments", "name it <something>.tar.gz")
    interpreter = shutil.which(python)
    if interpreter is None:
        raise UserError(f"no {python} here to build the execution environment with", f"install {python} (the stub's Python)")
    version = python_version(interpreter)
    if Path(target_python).name not in (f"python{version}", "python3", "python"):
        raise UserError(f"target interpreter {target_python} is not python{version}", f"give the target's python{version}")
    with tempfile.TemporaryDirectory(prefix="hf2triton-env-") as tmp:
        env = Path(tmp) / "env"
        subprocess.run([interpreter, "-m", "venv", "--without-pip", str(env)], check=True)  # noqa: S603
        # this venv's pip installs into it (pip --python): the env carries no pip of its own
        pip = [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "--disable-pip-version-check"]
        subprocess.run([*pip, "install", "--no-input", "--quiet", "--only-binary=:all:", *pins], check=True)  # noqa: S603
        retarget(env, target_python)
        output.parent.mkdir(parents=True, exist_ok=True)
        partial = output.with_name(output.name + ".partial.tar.gz")
        venv_pack.pack(prefix=str(env), output=str(partial), force=True)
        partial.replace(output)
    return output


def with_execution_env(config_pbtxt: str, archive: str = ENV_ARCHIVE) -> str:
    """A Python model's config.pbtxt text with EXECUTION_ENV_PATH naming `archive` in its model directory
    ($$TRITON_MODEL_DIRECTORY: resolved where Triton put the model, also a copy it downloaded from S3)."""
    if not ARCHIVE_NAME.match(archive):
        raise UserError(f"execution environment archive {archive!r} is not a file name ending .tar.gz", "use e.g. python_env.tar.gz")
    config = text_format.Parse(config_pbtxt, mc.ModelConfig())
    if config.backend != "python":
        raise UserError(f"model {config.name}: backend {config.backend!r} has no execution environment", "only Python models take one")
    config.parameters[EXECUTION_ENV_PATH].string_value = f"$$TRITON_MODEL_DIRECTORY/{archive}"
    return config_text(config)


def read_requirements(path: str) -> list[str]:
    """The requirement lines of a file (comments and blank lines dropped), checked to be pinned."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        fix = "name a pinned requirements file, e.g. envs/execution-env.txt"
        raise UserError(f"publish.execution_env = {path!r}: cannot read it ({err.strerror})", fix) from None
    return check_pinned([line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()])


def execution_env_step(requirements: str, output: str, python: str, target_python: str) -> dict[str, str]:
    """Rule execution_env: the pinned requirements file -> one packed environment every published model carries."""
    pins = read_requirements(requirements)
    archive = pack_execution_env(pins, output, python=python, target_python=target_python)
    return {"archive": str(archive), "requirements": ", ".join(pins), "size_mb": f"{archive.stat().st_size / 1e6:.1f}"}
