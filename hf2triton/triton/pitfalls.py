"""Known Triton failure messages and their fixes (the table in docs/troubleshooting.md).

Used to explain a server log or client error: the launcher, validation and status all print the
matching fix next to Triton's own words. A pattern must match only its own failure (never a line every log
has, like the backend table listing shm-default-byte-size), and a command a fix suggests is in backticks and
one of COMMANDS (a test runs them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hf2triton.serving import interface

# The commands fixes may suggest, run from the project directory (tests check each one works).
RENDER = "make serve"  # re-renders what changed or went missing, then (re)loads it
LINT = ".venv/bin/python -m hf2triton lint model_repository"  # the repository lint (the rule `lint` has wildcards)
COMMANDS = (RENDER, LINT)


@dataclass(frozen=True)
class Pitfall:
    pattern: str
    cause: str
    fix: str
    generic: bool = False  # a consequence of many failures: shown only when no specific pitfall explains the text

    def matches(self, text: str) -> bool:
        return re.search(self.pattern, text) is not None


PITFALLS = [
    Pitfall(
        r"unexpected directory name '.*' for model",
        "directory name differs from `name:`",
        "make the directory name equal the name in config.pbtxt",
    ),
    Pitfall(
        r"Error parsing text-format inference\.ModelConfig",
        "config.pbtxt syntax error or misspelled field",
        f"fix the line/column given (the lint names the field: `{LINT}`)",
    ),
    Pitfall(r"at least one version must be available", "no numeric version directory", "create the version directory 1/ with model.py"),
    Pitfall(
        r"ignore version directory '.*' which fails to convert",
        "non-numeric directory in the model dir (e.g. .ipynb_checkpoints)",
        "remove it; version directories are integers",
    ),
    Pitfall(r"has kind KIND_GPU but no GPUs are available", "KIND_GPU on a host without GPU", "set device: cpu (or auto) for the model"),
    Pitfall(
        r"unable to find backend library for backend",
        "backend absent from the server (the pip wheel has only python)",
        "use backend: python, or a Triton install that has the backend",
    ),
    Pitfall(r"must specify 'data_type'", "input/output without data_type", "set data_type in config.pbtxt"),
    Pitfall(
        r"ModuleNotFoundError: No module named",
        "model.py imports a package the stub's Python lacks",
        "install it into the .venv the server runs with (make serve)",
    ),
    Pitfall(
        r"libpython3\.\d+\.so[.\d]*: cannot open shared object|undefined symbol: _Py",
        "stub/libpython mismatch",
        "use the stub of the running Python and put its LIBDIR on LD_LIBRARY_PATH (hf2triton does this)",
    ),
    Pitfall(r"Python model file not found", "1/model.py missing", f"re-render the repository: `{RENDER}`"),
    Pitfall(
        # Triton's own words for it (they mention docker's --shm-size); "shm-default-byte-size" alone is in
        # the backend table every log prints, whatever the failure
        r"Unable to initialize shared memory key|Failed to increase the shared memory pool size|use '--shm-size' flag",
        "Python-backend shared memory too small or /dev/shm full",
        "raise server.shm_default_byte_size, or free /dev/shm",
    ),
    Pitfall(
        r"[Ss]ocket '.*' already in use|Address already in use|failed to start (HTTP|GRPC|Metrics)",
        "a port is taken",
        "stop whatever holds it or choose other server.*_port values in config.yaml",
    ),
    Pitfall(
        r"deserialize_bytes_tensor|unpack_from requires a buffer",
        "numpy 2 in the stub's Python breaks string tensors",
        "use numpy<2 in the environment the server runs with",
    ),
    Pitfall(
        r"Stub process .* is not healthy",
        "a Python-backend stub process died",
        "read the lines above in the server log; hf2triton serve restarts the server",
        generic=True,
    ),
    Pitfall(
        r"CUDA out of memory|OutOfMemoryError", "the model does not fit in GPU memory", "fewer instances, a smaller dtype, or device: cpu"
    ),
    Pitfall(
        r"failed to load all models|failed to load '", "a model failed to load", "read that model's own error just above", generic=True
    ),
    Pitfall(r"unexpected shape for input", "batch dimension missing or wrong shape", "send texts as shape [n, 1] (one row per text)"),
    Pitfall(r"unexpected inference input", "wrong input name", f"the input is called '{interface.TEXT}'"),
    Pitfall(r"data-type is '.*', but model '.*' expects", "wrong dtype", "send BYTES for text, INT32 max_new_tokens, FP32 temperature"),
    Pitfall(r"batch-size must be <=", "batch larger than max_batch_size", "split the request or raise max_batch_size"),
]


def explain(text: str) -> list[Pitfall]:
    """The pitfalls whose message occurs in `text` (most specific first, as listed); the generic ones (a stub
    died, a model failed to load) only when nothing specific does: a missing model.py also kills its stub."""
    found = [p for p in PITFALLS if p.matches(text)]
    specific = [p for p in found if not p.generic]
    return specific or found


def relevant_log_lines(log_text: str, limit: int = 15) -> list[str]:
    """Error lines of a Triton log worth showing a user (harmless NVML/DCGM noise left out)."""
    noise = ("NVML", "DCGM", "Unable to allocate pinned system memory", "CUDA driver version is insufficient", "libcuda")
    lines = []
    for line in log_text.splitlines():
        if (line.startswith(("E", "W")) or "error" in line.lower() or explain(line)) and not any(n in line for n in noise):
            lines.append(line.strip())
    return lines[-limit:]
