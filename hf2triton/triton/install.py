"""Where a runnable tritonserver comes from (no Docker): one on PATH, or the nvidia-pytriton wheel's, plus
the environment and backend directory it needs."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from hf2triton.errors import UserError
from hf2triton.logs import without_secrets


@dataclass(frozen=True)
class Installation:
    """A tritonserver binary and what it needs to run."""

    binary: str
    origin: str  # "PATH" or "nvidia-pytriton wheel"
    backends: str  # directory holding <backend>/ subdirectories as shipped
    lib_dirs: tuple[str, ...] = ()
    stub: str | None = None  # Python-backend stub for the running Python (wheel only)


def python_stub_dir() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def locate_tritonserver() -> Installation:
    """A `tritonserver` on PATH wins (a user's full install); otherwise the nvidia-pytriton wheel's."""
    on_path = shutil.which("tritonserver")
    if on_path:
        root = Path(on_path).resolve().parent.parent
        backends = next((str(p) for p in (root / "backends", Path("/opt/tritonserver/backends")) if p.is_dir()), str(root / "backends"))
        return Installation(binary=on_path, origin="PATH", backends=backends)
    try:
        import pytriton
    except ImportError:
        raise UserError(
            "no tritonserver found: not on PATH and nvidia-pytriton is not installed",
            "run `make serve` (installs nvidia-pytriton==0.7.0 into .venv) or put tritonserver on PATH",
        ) from None
    root = Path(pytriton.__file__).resolve().parent / "tritonserver"
    stub = root / "python_backend_stubs" / python_stub_dir() / "triton_python_backend_stub"
    if not stub.is_file():
        available = sorted(p.name for p in (root / "python_backend_stubs").iterdir()) if (root / "python_backend_stubs").is_dir() else []
        raise UserError(
            f"the Triton wheel has no Python-backend stub for Python {python_stub_dir()} (it has {', '.join(available) or 'none'})",
            "create .venv with one of those Python versions",
        )
    for program in (root / "bin" / "tritonserver", stub):
        if not os.access(program, os.X_OK):  # e.g. unpacked by a tool that drops file modes
            raise UserError(f"{program} is not executable", f"chmod +x {program}, or reinstall nvidia-pytriton (`make serve` does)")
    wheel_libs = root.parent.parent / "nvidia_pytriton.libs"
    return Installation(
        binary=str(root / "bin" / "tritonserver"),
        origin="nvidia-pytriton wheel",
        backends=str(root / "backends"),
        lib_dirs=(str(wheel_libs),),
        stub=str(stub),
    )


def prepare_backend_dir(install: Installation, server_dir: Path) -> str:
    """The --backend-directory to use. For the wheel: a copy of its python backend plus the stub that
    matches the running Python (the wheel ships one per Python version elsewhere)."""
    if install.stub is None:
        return install.backends
    target = server_dir / "backends" / "python"
    target.mkdir(parents=True, exist_ok=True)
    source = Path(install.backends) / "python"
    for path in [source / "libtriton_python.so", source / "triton_python_backend_utils.py", Path(install.stub)]:
        dest = target / path.name
        if not dest.exists() or dest.stat().st_size != path.stat().st_size or dest.stat().st_mtime < path.stat().st_mtime:
            shutil.copy2(path, dest)
    return str(target.parent)


def server_environment(install: Installation) -> dict[str, str]:
    """Environment for tritonserver: wheel libs + this interpreter's LIBDIR first on LD_LIBRARY_PATH (else the
    stub may load the system libpython against another stdlib), and this venv's bin first on PATH (the stub
    imports numpy etc. from the python3 found there)."""
    env = without_secrets(os.environ)  # the server never needs hub credentials
    libdir = sysconfig.get_config_var("LIBDIR")
    parts = [*install.lib_dirs, *([libdir] if libdir else []), *filter(None, env.get("LD_LIBRARY_PATH", "").split(":"))]
    env["LD_LIBRARY_PATH"] = ":".join(dict.fromkeys(parts))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")  # per-model threads are set in model.py
    env.pop("PYTHONPATH", None)
    return env
