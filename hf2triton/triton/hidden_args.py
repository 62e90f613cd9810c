"""Secret command-line arguments that never appear in /proc/<pid>/cmdline.

tritonserver takes its admin key only as a command-line flag, and /proc/<pid>/cmdline is world-readable.
So the command line carries placeholders ("@hf2triton-env:NAME"), the real arguments travel in the
environment (/proc/<pid>/environ is 0400), and a tiny LD_PRELOAD library (argv_from_env.c, compiled here
with the system C compiler) swaps them into argv before tritonserver's main() runs, then removes the
variables and itself from the environment that the server's child processes inherit.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from hf2triton.errors import UserError

PLACEHOLDER_PREFIX = "@hf2triton-env:"  # must match PREFIX in argv_from_env.c
KEEP_LD_PRELOAD = "HF2TRITON_LD_PRELOAD"  # the user's own LD_PRELOAD, restored by the shim for children
SHIM_SOURCE = Path(__file__).with_name("argv_from_env.c")
CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall")


def placeholder(name: str) -> str:
    """The argv entry the shim replaces with the value of environment variable `name`."""
    return PLACEHOLDER_PREFIX + name


def hide_arguments(arguments: dict[str, str], shim: str, ld_preload: str | None = None) -> tuple[list[str], dict[str, str]]:
    """For {environment variable name: real argument}: the placeholder argv entries (in that order) and the
    environment additions that make the shim put the real arguments in their place. `ld_preload` is the
    LD_PRELOAD the program would otherwise get; it stays in effect for the program and its children."""
    for name in arguments:
        if not name or not all(c.isalnum() or c == "_" for c in name):
            raise ValueError(f"not a usable environment variable name: {name!r}")
    if any(c in shim for c in " \t\n:"):  # LD_PRELOAD separators: the library would not load
        raise UserError(f"the path {shim} cannot be preloaded (it contains a space or a colon)", "use a work directory without them")
    env = dict(arguments)
    env["LD_PRELOAD"] = f"{shim}:{ld_preload}" if ld_preload else shim
    env[KEEP_LD_PRELOAD] = ld_preload or ""
    return [placeholder(name) for name in arguments], env


def _compiler() -> str:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise UserError(
            "no C compiler (cc or gcc) found: hf2triton compiles a tiny library that keeps the server's admin key "
            "off its command line, where every local user could read it",
            "install gcc (apt-get install gcc / conda install gcc)",
        )
    return compiler


def build_shim(directory: Path | str) -> str:
    """Path of the compiled shim in `directory` (made private, 0700), built when missing or when
    argv_from_env.c changed (the file name holds the source's digest)."""
    directory = Path(directory)
    source = SHIM_SOURCE.read_bytes()
    target = directory / f"argv_from_env-{hashlib.sha256(source).hexdigest()[:12]}.so"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)  # the library runs inside our server: nobody else may replace it
    if target.is_file():
        return str(target)
    compiler = _compiler()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        result = subprocess.run([compiler, *CFLAGS, "-o", tmp, str(SHIM_SOURCE)], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise UserError(
                f"compiling {SHIM_SOURCE.name} with {compiler} failed: {(result.stderr or result.stdout).strip()[-1500:]}",
                "install a working gcc (apt-get install gcc / conda install gcc)",
            )
        os.chmod(tmp, 0o700)
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    for old in directory.glob("argv_from_env-*.so"):  # built from an older source; a running server keeps its mapping
        if old != target:
            old.unlink(missing_ok=True)
    return str(target)
