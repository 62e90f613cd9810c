"""Which build of the pinned torch this host gets: the CPU build without an NVIDIA GPU, else the newest CUDA build
(envs/torch-variants.txt) that the driver and every GPU support; TORCH_VARIANT overrides. Checked before pip runs,
with the disk space the chosen set needs.

Standard library only: the Makefile runs it with the system Python before the venv exists
(`python3 -m hf2triton.torch_variant pip-args`).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from hf2triton import host  # standard library only, like this module

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "envs" / "torch-variants.txt"
REQUIREMENTS = ROOT / "envs" / "requirements.txt"
GB = 1024**3


class VariantError(Exception):
    """No build fits (or the override is unknown, or the disk is too small): the message names the fix."""


@dataclass(frozen=True)
class Variant:
    name: str
    index: str
    cuda: str  # "-" for the CPU build
    min_driver: str  # "-" for the CPU build
    venv_gb: float
    download_gb: float
    capabilities: tuple[str, ...]

    @property
    def is_cuda(self) -> bool:
        return self.cuda != "-"


@dataclass(frozen=True)
class Gpu:
    driver: str
    capability: str  # "9.0"


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


def read_table(path: Path = TABLE) -> list[Variant]:
    variants = []
    for line in path.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        name, index, cuda, driver, venv_gb, download_gb, *capabilities = fields
        variants.append(
            Variant(
                name,
                index,
                cuda,
                driver,
                float(venv_gb),
                float(download_gb),
                tuple(c for c in capabilities if c != "-"),
            )
        )
    return variants


def parse_smi(output: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=driver_version,compute_cap --format=csv,noheader` -> one Gpu per line."""
    return gpus_of([[p.strip() for p in line.split(",")] for line in output.strip().splitlines()])


def gpus_of(rows: list[list[str]]) -> list[Gpu]:
    return [Gpu(row[0], row[1]) for row in rows if len(row) == 2 and row[0] and row[1]]


def detect_gpus() -> list[Gpu]:
    """The host's NVIDIA GPUs (none without a working nvidia-smi; HF2TRITON_ASSUME_NO_GPU=1: none)."""
    return gpus_of(host.query_gpus("driver_version,compute_cap") or [])


def supports(variant: Variant, gpu: Gpu) -> bool:
    return version_tuple(gpu.driver) >= version_tuple(variant.min_driver) and gpu.capability in variant.capabilities


def choose(gpus: list[Gpu], variants: list[Variant], override: str = "") -> tuple[Variant, str]:
    """The build and why. No GPU: cpu. GPUs: the newest CUDA build that every one of them supports."""
    by_name = {v.name: v for v in variants}
    if override:
        if override not in by_name:
            raise VariantError(f"TORCH_VARIANT={override} is not a build of the pinned torch -- fix: one of {', '.join(by_name)}")
        return by_name[override], f"TORCH_VARIANT={override}"
    if not gpus:
        return by_name["cpu"], "no NVIDIA GPU"
    seen = "; ".join(f"driver {g.driver}, compute capability {g.capability}" for g in gpus)
    cuda = sorted((v for v in variants if v.is_cuda), key=lambda v: version_tuple(v.cuda), reverse=True)
    for variant in cuda:
        if all(supports(variant, gpu) for gpu in gpus):
            return variant, f"the newest build for {seen}"
    needs = "; ".join(f"{v.name}: driver >= {v.min_driver}, compute capability {' '.join(v.capabilities)}" for v in cuda)
    raise VariantError(
        f"no CUDA build of the pinned torch runs on this GPU ({seen}); the builds need {needs}",
        "update the NVIDIA driver (580 or newer for CUDA 13), or serve on the CPU: TORCH_VARIANT=cpu make ... "
        "and device: cpu for the models",
    )


def require(name: str, gpus: list[Gpu], variants: list[Variant]) -> None:
    """An environment whose packages exist in one CUDA build only (vLLM 0.22.1: CUDA 13) needs GPUs that run it."""
    variant = next((v for v in variants if v.name == name), None)
    if variant is None or not variant.is_cuda:
        raise VariantError(f"{name!r} is not a CUDA build of envs/torch-variants.txt")
    if not gpus:
        raise VariantError(f"the {name} build needs an NVIDIA GPU; none is visible (nvidia-smi)", "use backend: python on this host")
    failing = [g for g in gpus if not supports(variant, g)]
    if failing:
        seen = "; ".join(f"driver {g.driver}, compute capability {g.capability}" for g in failing)
        raise VariantError(
            f"the {name} build (CUDA {variant.cuda}) needs driver >= {variant.min_driver} and compute capability "
            f"{' '.join(variant.capabilities)}; this host has {seen}",
            "update the NVIDIA driver, or use backend: python (torch) for this model",
        )


def pinned_torch(requirements: Path = REQUIREMENTS) -> str:
    for line in requirements.read_text().splitlines():
        found = re.match(r"\s*torch==([\w.]+)", line)
        if found:
            return found.group(1)
    raise VariantError(f"{requirements} pins no torch==VERSION")


def find_links() -> list[Path]:
    """pip's find-links directories (PIP_FIND_LINKS, pip.conf's [global] find-links)."""
    values = os.environ.get("PIP_FIND_LINKS", "").split()
    for conf in ("/etc/pip.conf", "/etc/xdg/pip/pip.conf", str(Path.home() / ".config/pip/pip.conf"), str(Path.home() / ".pip/pip.conf")):
        try:
            text = Path(conf).read_text()
        except OSError:
            continue
        found = re.search(r"^find-links\s*=\s*(.+(?:\n[ \t]+.+)*)", text, re.MULTILINE)
        if found:
            values += found.group(1).split()
    return [Path(v.removeprefix("file://")) for v in values if "://" not in v or v.startswith("file://")]


def wheel_at_hand(version: str, variant: Variant, directories: list[Path]) -> Path | None:
    """A local wheel of torch VERSION+VARIANT for this Python (some images carry one in a find-links directory)."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for directory in directories:
        for wheel in sorted(directory.glob(f"torch-{version}+{variant.name}-{tag}-{tag}-*.whl")) if directory.is_dir() else []:
            return wheel
    return None


def pip_arguments(variant: Variant, version: str, directories: list[Path] | None = None) -> list[str]:
    """What `pip install` gets to install this build: the local-version pin, and its index unless a wheel is at hand
    (then pip needs no index it might not reach)."""
    arguments = [f"torch=={version}+{variant.name}"]
    if wheel_at_hand(version, variant, find_links() if directories is None else directories) is None:
        arguments += ["--extra-index-url", variant.index]
    return arguments


def installed(venv: Path, version: str, variant: Variant) -> bool:
    """The venv has this very build already (a re-run of setup after a requirements change)."""
    return any(venv.glob(f"lib/python*/site-packages/torch-{version}+{variant.name}.dist-info"))


def check_disk(variant: Variant, venv: Path, free_bytes: int | None = None) -> None:
    """The venv's disk must hold the chosen set (download and install at once: both counted)."""
    target = venv if venv.exists() else venv.parent
    free = shutil.disk_usage(target).free if free_bytes is None else free_bytes
    need = (variant.venv_gb + variant.download_gb) * GB
    if free < need:
        raise VariantError(
            f"{target.resolve()} has {free / GB:.1f} GB free; torch's {variant.name} build and the rest of the venv need "
            f"{need / GB:.1f} GB ({variant.venv_gb:g} GB installed + {variant.download_gb:g} GB downloaded on the way)",
            "free space, or put the project (its .venv) on a larger disk"
            + ("; a CPU-only host: TORCH_VARIANT=cpu needs 2.8 GB" if variant.is_cuda else ""),
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hf2triton.torch_variant", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "command",
        choices=("pip-args", "describe", "supports"),
        help="pip-args: check, print one line, then pip's arguments; supports VARIANT: exit 2 unless every GPU runs that build",
    )
    parser.add_argument("variant", nargs="?", default="", help="supports: the build another environment needs (vLLM: cu130)")
    parser.add_argument("--venv", default=".venv", help="where the venv goes (its disk is checked)")
    args = parser.parse_args(argv)
    try:
        if args.command == "supports":
            require(args.variant, detect_gpus(), read_table())
            return 0
        variant, why = choose(detect_gpus(), read_table(), os.environ.get("TORCH_VARIANT", "").strip())
        version = pinned_torch()
        if args.command == "describe":
            print(f"torch {version}+{variant.name} ({why})")
            return 0
        if not installed(Path(args.venv), version, variant):
            check_disk(variant, Path(args.venv))
        print(f"hf2triton: torch {version}+{variant.name} ({why}; TORCH_VARIANT=cpu|cu126|cu130 overrides)", file=sys.stderr)
        print(" ".join(pip_arguments(variant, version)))
        return 0
    except VariantError as err:
        message, fix = (err.args + ("",))[:2]
        print(f"hf2triton: error: {message}" + (f" -- fix: {fix}" if fix else ""), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
