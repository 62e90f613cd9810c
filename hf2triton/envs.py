"""The Python environments a config needs beside .venv, and the checks that they are usable.

backend vllm runs in a venv of its own (config `paths.vllm_env`, default .venv-vllm, built from envs/vllm.txt):
vLLM 0.22.1 pins torch 2.11.0 (a CUDA 13 build) where the main environment pins torch 2.13, so they cannot share
one. Triton's Python backend starts a model's stub inside another environment when its config.pbtxt names one
(`EXECUTION_ENV_PATH`: a directory holding bin/activate; the stub then imports from that venv's site-packages),
so only the vllm models run there and everything else stays in .venv. The Makefile asks this module whether
the config needs it before serving:

    python -m hf2triton.envs needs-vllm [--config FILE] [--configfile OVERLAY ...]

prints the vLLM environment's directory when a model of the config uses backend vllm, and nothing otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from hf2triton.errors import UserError, exit_on_user_error
from hf2triton.specs import ModelSpec, ProjectSpec

VLLM = "vllm"
VLLM_REQUIREMENTS = "envs/vllm.txt"


def vllm_env_needed(project: ProjectSpec) -> str | None:
    """The vLLM environment's directory (as configured) when a model uses backend vllm, else None."""
    return project.vllm_env if any(m.backend == VLLM for m in project.models) else None


def require_vllm_gpu(models: Sequence[ModelSpec], gpu_available: bool) -> None:
    """Stop before any work where a model asks for backend vllm on a machine without a CUDA GPU (vLLM's engine
    needs one; the torch engine streams on the CPU too)."""
    wanted = [m.name for m in models if m.backend == VLLM]
    if wanted and not gpu_available:
        raise UserError(
            f"model {', '.join(wanted)}: backend vllm needs a CUDA GPU, and this machine has none",
            "use backend: python for it (the same streaming model, run by torch), or serve on a machine with an NVIDIA GPU",
        )


def check_vllm_env(path: str) -> None:
    """Refuse an environment Triton's stub could not run in: no bin/activate (Triton fails the load with
    "The Python environment should contain an 'activate' script"), or a venv of another Python version (the
    stub is this Python's and would not find that venv's packages)."""
    env = Path(path)
    fix = f"run `make serve` (it builds {env} from {VLLM_REQUIREMENTS}), or point paths.vllm_env at a venv holding vllm"
    if not (env / "bin" / "activate").is_file():
        raise UserError(f"the vLLM environment {env} is missing (no bin/activate)", fix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if not (env / "lib" / version / "site-packages").is_dir():
        found = sorted(p.name for p in (env / "lib").glob("python3*"))
        raise UserError(
            f"the vLLM environment {env} is not a {version} venv (it has {', '.join(found) or 'no lib/python3.*'}): "
            f"Triton's stub runs {version}",
            f"remove {env} and build it again with this Python (`make serve`), or point paths.vllm_env at a {version} venv",
        )


def _project(config: str | None, overlays: Sequence[str]) -> ProjectSpec:
    from hf2triton.config import deep_merge, read_yaml
    from hf2triton.specs import load_project

    merged: dict = {}
    for overlay in overlays:
        merged = deep_merge(merged, read_yaml(Path(overlay)) or {})
    return load_project(config or os.environ.get("HF2TRITON_CONFIG") or "config.yaml", merged or None)


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hf2triton.envs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    needs = sub.add_parser("needs-vllm", help="print the vLLM environment's directory if the config needs it (else nothing)")
    needs.add_argument("--config", help="config file (default: $HF2TRITON_CONFIG, else ./config.yaml)")
    needs.add_argument("--configfile", nargs="*", default=[], help="overlays merged over it (default: $HF2TRITON_OVERLAY)")
    args = parser.parse_args(argv)
    overlays = args.configfile or [p for p in [os.environ.get("HF2TRITON_OVERLAY")] if p]
    env = vllm_env_needed(_project(args.config, overlays))
    if env:
        print(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
