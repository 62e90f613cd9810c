"""What gets installed and loaded follows the host.

Issue 30, torch's build: the choice on recorded nvidia-smi outputs (drivers 470-580, compute capabilities 6.0-12.0),
the install arguments each choice gives, the disk check, the override, the CLI with a fake nvidia-smi, the venv built
here (a CPU host: the CPU build), and the preflight check that refuses a GPU model when torch cannot run CUDA.
Issue 29 #2: ONNX Runtime's provider follows the instance's device."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hf2triton import host
from hf2triton.pipeline.preflight import torch_cuda_check
from hf2triton.torch_variant import GB, VariantError, check_disk, choose, parse_smi, pinned_torch, pip_arguments, read_table
from tests.helpers import CUDA_TORCH, ROOT

VARIANTS = read_table()
BY_NAME = {v.name: v for v in VARIANTS}
TAG = f"cp{sys.version_info.major}{sys.version_info.minor}"


@pytest.mark.parametrize(
    ("smi", "expected"),
    [
        ("", "cpu"),
        ("580.95.05, 9.0", "cu130"),  # H200 (the device machine)
        ("580.65.06, 7.5", "cu130"),  # T4 on the first CUDA 13 driver
        ("570.172.08, 9.0", "cu126"),  # CUDA 13 needs 580
        ("550.54.15, 8.0", "cu126"),  # A100 on a 550 driver
        ("535.104.05, 7.5", "cu126"),  # T4 on a free-tier notebook's 535
        ("580.95.05, 7.0", "cu126"),  # V100: CUDA 13 dropped Volta
        ("580.95.05, 6.0", "cu126"),  # P100: Pascal only in the 12.6 build
        ("580.95.05, 9.0\n580.95.05, 7.0", "cu126"),  # every GPU must be supported
    ],
)
def test_the_newest_build_the_driver_and_gpu_support(smi, expected):
    variant, why = choose(parse_smi(smi), VARIANTS)
    assert variant.name == expected, why


@pytest.mark.parametrize(
    ("smi", "named"),
    [("470.256.02, 8.0", "driver 470.256.02"), ("570.172.08, 12.0", "compute capability 12.0")],
)
def test_no_build_fits_names_driver_gpu_and_fix(smi, named):
    with pytest.raises(VariantError) as info:
        choose(parse_smi(smi), VARIANTS)
    message, fix = info.value.args
    assert named in message and "cu126: driver >= 525.60.13" in message and "cu130: driver >= 580.65.06" in message
    assert "update the NVIDIA driver" in fix and "TORCH_VARIANT=cpu" in fix


def test_override_and_unknown_override():
    assert choose(parse_smi("580.95.05, 9.0"), VARIANTS, "cpu")[0].name == "cpu"
    assert choose([], VARIANTS, "cu126")[0].name == "cu126"
    with pytest.raises(VariantError, match="TORCH_VARIANT=cu999 is not a build of the pinned torch"):
        choose([], VARIANTS, "cu999")


def test_install_arguments_pin_the_build_and_its_index_unless_a_wheel_is_at_hand(tmp_path):
    version = pinned_torch()
    assert version == "2.13.0"
    cu130 = pip_arguments(BY_NAME["cu130"], version, [tmp_path])
    assert cu130 == ["torch==2.13.0+cu130", "--extra-index-url", "https://download.pytorch.org/whl/cu130"]
    assert pip_arguments(BY_NAME["cpu"], version, [tmp_path]) == [
        "torch==2.13.0+cpu",
        "--extra-index-url",
        "https://download.pytorch.org/whl/cpu",
    ]
    (tmp_path / f"torch-2.13.0+cpu-{TAG}-{TAG}-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert pip_arguments(BY_NAME["cpu"], version, [tmp_path]) == ["torch==2.13.0+cpu"], "no index it might not reach"


def test_disk_check_counts_download_and_install(tmp_path):
    cu130 = BY_NAME["cu130"]
    with pytest.raises(VariantError) as info:
        check_disk(cu130, tmp_path / ".venv", free_bytes=4 * GB)
    message, fix = info.value.args
    assert "has 4.0 GB free" in message and "need 9.2 GB (6 GB installed + 3.2 GB downloaded on the way)" in message
    assert "larger disk" in fix and "TORCH_VARIANT=cpu needs 2.8 GB" in fix
    check_disk(cu130, tmp_path / ".venv", free_bytes=10 * GB)
    check_disk(BY_NAME["cpu"], tmp_path / ".venv", free_bytes=3 * GB)


def fake_smi(tmp_path, output: str) -> dict[str, str]:
    """An environment whose nvidia-smi prints `output` for the query (and lists a GPU)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\ncase \"$1\" in -L) echo 'GPU 0: fake';; *) printf '%s\\n' '{output}';; esac\n")
    script.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TORCH_VARIANT": ""}


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    # the system Python, as the Makefile runs it before the venv exists: the module needs the standard library only
    return subprocess.run(  # noqa: S603
        [sys.executable, "-I", "-m", "hf2triton.torch_variant", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_cli_reads_nvidia_smi(tmp_path):
    done = run_cli("describe", env=fake_smi(tmp_path, "580.95.05, 9.0"))
    assert (
        done.returncode == 0 and done.stdout.strip() == "torch 2.13.0+cu130 (the newest build for driver 580.95.05, compute capability 9.0)"
    )
    done = run_cli("pip-args", "--venv", str(tmp_path / "venv"), env=fake_smi(tmp_path, "470.256.02, 8.0"))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("hf2triton: error: no CUDA build of the pinned torch runs on this GPU (driver 470.256.02")


def test_cli_on_this_cpu_host_gives_the_cpu_build():
    env = {**os.environ, "TORCH_VARIANT": "", "HF2TRITON_ASSUME_NO_GPU": "1"}
    done = run_cli("pip-args", "--venv", str(ROOT / ".venv"), env=env)  # installed already: no disk check
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "torch==2.13.0+cpu"
    assert "hf2triton: torch 2.13.0+cpu (no NVIDIA GPU; TORCH_VARIANT=cpu|cu126|cu130 overrides)" in done.stderr


@pytest.mark.skipif(host.has_gpu(), reason="a GPU host gets a CUDA build")
def test_the_venv_setup_built_here_holds_the_cpu_build():
    """`make test` built .venv through the Makefile (on CI: from a fresh clone): a host without a GPU got the CPU
    build, not PyPI's CUDA one (2.74 GB of downloads: benchmarks/bench-2cpu/torch-download.json)."""
    import torch

    assert torch.__version__ == "2.13.0+cpu" and torch.version.cuda is None
    facts = host.torch_facts()
    assert facts == {"version": "2.13.0+cpu", "cuda_build": "cpu", "driver": "none", "cuda_works": False}
    assert host.describe_torch(facts) == "torch 2.13.0+cpu (CPU build), driver none, CUDA not used: no NVIDIA GPU"


def test_preflight_refuses_gpu_models_when_torch_cannot_run_cuda():
    broken = {**CUDA_TORCH, "cuda_works": False, "reason": "The NVIDIA driver on your system is too old (found version 12020)."}
    check = torch_cuda_check(broken, ["smollm2"])
    assert not check["ok"] and "driver on your system is too old" in check["detail"] and "on the GPU: smollm2" in check["detail"]
    assert "TORCH_VARIANT=cu126" in check["fix"] and "device: cpu" in check["fix"]
    assert torch_cuda_check(CUDA_TORCH, ["smollm2"])["ok"]


def test_the_vllm_environment_needs_gpus_that_run_cuda_13():
    from hf2triton.torch_variant import require

    require("cu130", parse_smi("580.95.05, 9.0"), VARIANTS)
    for smi, named in (("", "none is visible"), ("570.172.08, 9.0", "driver 570.172.08"), ("580.95.05, 7.0", "compute capability 7.0")):
        with pytest.raises(VariantError, match=named):
            require("cu130", parse_smi(smi), VARIANTS)
    recipe = (ROOT / "Makefile").read_text().split("$(VLLM_VENV)/.installed:", 1)[1]
    assert recipe.index("torch_variant supports cu130") < recipe.index("-m venv"), "checked before anything is installed"


def test_onnx_runs_on_its_instance_s_device_or_refuses_to_load(tmp_path):
    """Issue 29 #2: the provider follows the instance (no silent CPU on a GPU instance); the CPU package on a GPU
    instance is refused at load and in preflight, naming the fix."""
    import onnx
    from onnx import TensorProto, helper

    from hf2triton.pipeline.preflight import onnx_cuda_check
    from hf2triton.serving.runtimes.onnxruntime import ort_providers, ort_session

    cpu, cuda = "CPUExecutionProvider", "CUDAExecutionProvider"
    assert ort_providers("cpu", [cuda, cpu]) == [cpu], "device: cpu forces the CPU"
    assert ort_providers("cuda:1", [cuda, cpu]) == [(cuda, {"device_id": 1}), cpu]
    assert ort_providers("cuda", [cuda, cpu]) == [(cuda, {"device_id": 0}), cpu], "a bare 'cuda' is the first GPU"
    with pytest.raises(RuntimeError, match="no CUDA provider .* install onnxruntime-gpu .* or set device: cpu"):
        ort_providers("cuda:0", [cpu])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    path = tmp_path / "identity.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert ort_session(str(path), 1).get_providers() == [cpu]
    with pytest.raises(RuntimeError, match="no CUDA provider"):  # this machine's onnxruntime is the CPU package
        ort_session(str(path), 1, device="cuda:0")
    check = onnx_cuda_check([cpu], ["minilm"])
    assert not check["ok"] and "backend onnx on the GPU: minilm" in check["detail"] and "onnxruntime-gpu" in check["fix"]
    assert onnx_cuda_check([cuda, cpu], ["minilm"])["ok"]
