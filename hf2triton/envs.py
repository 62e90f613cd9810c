"""The Python environments a config needs beside .venv, and the checks that they are usable.

backend vllm runs in a venv of its own (config `paths.vllm_env`, default .venv-vllm, built from envs/vllm.txt):
vLLM 0.22.1 pins torch 2.11.0 (a CUDA 13 build) where the main environment pins torch 2.13, so they cannot share
one. Triton's Python backend starts a model's stub inside another environment when its config.pbtxt names one
(`EXECUTION_ENV_PATH`: a directory holding bin/activate; the stub then imports from that venv's site-packages),
so only the vllm models run there and everything else stays in .venv. The Makefile asks this module whether
the config needs it before serving:

    python -m hf2triton.envs needs-vllm [--config FILE] [--configfile OVERLAY ...]

prints the vLLM environment's directory when a model of the config uses backend vllm, and nothing otherwise.

ONNX Runtime comes in two packages that install the same module: `onnxruntime` (CPU, envs/requirements.txt) and
`onnxruntime-gpu` (CUDA 13, envs/onnxruntime-gpu.txt). After requirements.txt, the Makefile runs

    python -m hf2triton.envs onnx-runtime [--config FILE] [--configfile OVERLAY ...]

which keeps the CPU packages unless the host runs torch's CUDA 13 build (hf2triton.torch_variant) and a model has
backend onnx on the GPU; then it swaps them for the GPU packages (and back, when that stops being true).
ONNXRUNTIME=cpu|gpu forces the choice.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from hf2triton.errors import UserError, exit_on_user_error
from hf2triton.specs import ModelSpec, ProjectSpec

VLLM = "vllm"
VLLM_REQUIREMENTS = "envs/vllm.txt"
ORT_CPU_PACKAGES = ("onnxruntime", "onnxruntime-genai")  # pinned in envs/requirements.txt
ORT_GPU_PACKAGES = ("onnxruntime-gpu", "onnxruntime-genai-cuda")  # pinned in envs/onnxruntime-gpu.txt
ENVS = Path(__file__).resolve().parent.parent / "envs"
ORT_GPU_REQUIREMENTS = str(ENVS / "onnxruntime-gpu.txt")
ORT_GPU_CUDA = "cu130"  # onnxruntime-gpu 1.31.1 is a CUDA 13 build: the torch build (hf2triton.torch_variant) it matches


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


def onnx_gpu_models(project: ProjectSpec, gpu_available: bool) -> list[str]:
    """Models that run ONNX Runtime on a GPU instance (backend onnx, device gpu or auto on a GPU host)."""
    from hf2triton.specs import instance_kind

    return [m.name for m in project.models if m.backend == "onnx" and instance_kind(m.device, gpu_available) == "KIND_GPU"]


def host_torch_build() -> str:
    """The torch build setup installs on this host (cpu, cu126, cu130)."""
    from hf2triton import torch_variant

    try:
        gpus, table = torch_variant.detect_gpus(), torch_variant.read_table()
        return torch_variant.choose(gpus, table, os.environ.get("TORCH_VARIANT", "").strip())[0].name
    except torch_variant.VariantError as err:
        raise UserError(*err.args[:2]) from None


def onnx_runtime_choice(gpu_models: list[str], torch_build: str, override: str = "") -> tuple[str, str]:
    """("cpu" | "gpu", why). The GPU package where a model runs ONNX on the GPU and the host runs CUDA 13 (the build
    onnxruntime-gpu is); a GPU host on an older driver is refused with the fix rather than served on the CPU."""
    if override:
        if override not in ("cpu", "gpu"):
            raise UserError(f"ONNXRUNTIME={override} is not a choice", "ONNXRUNTIME=cpu or ONNXRUNTIME=gpu (or leave it unset)")
        return override, f"ONNXRUNTIME={override}"
    if not gpu_models:
        return "cpu", "no model runs backend onnx on a GPU"
    if torch_build == "cpu":
        raise UserError(
            f"model {', '.join(gpu_models)}: backend onnx with device gpu, and this host has no NVIDIA GPU (nvidia-smi)",
            "set device: cpu (or auto) for these models, or serve on a machine with an NVIDIA GPU",
        )
    if torch_build != ORT_GPU_CUDA:
        raise UserError(
            f"model {', '.join(gpu_models)}: backend onnx on the GPU needs onnxruntime-gpu 1.31.1, a CUDA 13 build, and this "
            f"host's torch build is {torch_build} (the driver decides: hf2triton.torch_variant)",
            "update the NVIDIA driver to 580 or newer, or set device: cpu for these models (ONNX Runtime on the CPU), "
            "or backend: python (torch on the GPU)",
        )
    return "gpu", f"backend onnx on the GPU: {', '.join(gpu_models)}"


def installed_versions(names: Sequence[str]) -> dict[str, str]:
    """Which of `names` this environment's own site-packages holds (not packages a .pth makes visible from
    elsewhere: pip would not remove those, nor do they shadow this environment's)."""
    import sysconfig
    from importlib import metadata

    wanted = {re.sub(r"[-_.]+", "-", n).lower(): n for n in names}
    found = {}
    for dist in metadata.distributions(path=[sysconfig.get_paths()["purelib"]]):
        key = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
        if key in wanted:
            found[wanted[key]] = dist.version
    return found


def onnx_runtime_commands(choice: str, installed: dict[str, str], python: str = sys.executable) -> list[list[str]]:
    """The pip commands that leave exactly the chosen packages installed (none when they already are)."""
    wanted, unwanted = (ORT_GPU_PACKAGES, ORT_CPU_PACKAGES) if choice == "gpu" else (ORT_CPU_PACKAGES, ORT_GPU_PACKAGES)
    stale = [name for name in unwanted if name in installed]
    if not stale and all(name in installed for name in wanted):
        return []
    pip = [python, "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check"]
    if choice == "gpu":
        install = [*pip, "-r", ORT_GPU_REQUIREMENTS]
    else:  # the CPU pins of requirements.txt (their dependencies are the GPU packages' own: already there)
        install = [*pip, "--no-deps", *pinned_requirements(ORT_CPU_PACKAGES)]
    # The two packages share the module's files: removing the stale one breaks the other, so both go and the
    # wanted one comes back whole.
    remove = stale + [name for name in wanted if name in installed]
    return ([[python, "-m", "pip", "uninstall", "-y", *remove]] if stale else []) + [install]


def pinned_requirements(names: Sequence[str], path: Path = ENVS / "requirements.txt") -> list[str]:
    lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line.split("==", 1)[0].lower() in names]


def ensure_onnx_runtime(project: ProjectSpec, override: str = "") -> str:
    """Install the ONNX Runtime packages this host and config need; returns what was decided, for the log."""
    import subprocess

    from hf2triton import host

    gpu_models = onnx_gpu_models(project, host.has_gpu())
    choice, why = onnx_runtime_choice(gpu_models, host_torch_build() if gpu_models and not override else "", override)
    packages = ORT_GPU_PACKAGES if choice == "gpu" else ORT_CPU_PACKAGES
    for command in onnx_runtime_commands(choice, installed_versions(ORT_CPU_PACKAGES + ORT_GPU_PACKAGES)):
        print("hf2triton:", " ".join(command[1:]), file=sys.stderr, flush=True)
        subprocess.run(command, check=True)  # noqa: S603 - fixed programs and pinned names, no shell
    return f"ONNX Runtime: {', '.join(packages)} ({why}; ONNXRUNTIME=cpu|gpu overrides)"


def _project(config: str | None, overlays: Sequence[str]) -> ProjectSpec:
    from hf2triton.config import deep_merge, load_project, read_yaml

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
    runtime = sub.add_parser("onnx-runtime", help="install ONNX Runtime's CPU or GPU packages, as this host and config need")
    for command in (needs, runtime):
        command.add_argument("--config", help="config file (default: $HF2TRITON_CONFIG, else ./config.yaml)")
        command.add_argument("--configfile", nargs="*", default=[], help="overlays merged over it (default: $HF2TRITON_OVERLAY)")
    args = parser.parse_args(argv)
    overlays = args.configfile or [p for p in [os.environ.get("HF2TRITON_OVERLAY")] if p]
    project = _project(args.config, overlays)
    if args.command == "onnx-runtime":
        print(ensure_onnx_runtime(project, os.environ.get("ONNXRUNTIME", "").strip()))
        return 0
    env = vllm_env_needed(project)
    if env:
        print(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
