"""More than one GPU (issue 47), on the CPU: hosts of 1, 2, 4 and 8 GPUs are recorded nvidia-smi outputs (a script on
PATH that answers the queries hf2triton makes as an H100 host's nvidia-smi does), and what is checked is what
hf2triton derives from them -- `gpus: all | [...]` placement, a vllm engine's tensor / pipeline parallel span and
the GPUs it reserves, the rendered instance groups and parameters, preflight's per-GPU budget and its refusals, the
published manifest's and the Kubernetes manifests' GPU count. The multi-GPU runs themselves need a machine with
several GPUs (benchmarks/h200/README.md)."""

from __future__ import annotations

import copy
import stat
from pathlib import Path

import pytest

from hf2triton import host
from hf2triton.config import validate_config
from hf2triton.errors import UserError
from hf2triton.pipeline import preflight as pf
from hf2triton.specs import gpu_placement, project_spec, reserved_gpus, serving_values
from hf2triton.triton.modelconfig import build_model_config, config_gpus

GIB = 1024**3
H100_MIB = 81559  # nvidia-smi's memory.total of an H100 80GB HBM3
ENCODER = {"name": "embed", "source": "org/embed", "task": "feature-extraction", "device": "gpu"}
LLM = {"name": "llm", "source": "org/llm", "task": "text-generation", "backend": "vllm", "device": "gpu"}


def recorded_smi(directory: Path, free_mib: list[int]) -> Path:
    """An nvidia-smi answering `-L`, `--query-gpu=...` (index, memory.free, memory.total, name, driver_version,
    compute_cap; csv, noheader, with or without units) and `--query-compute-apps` for len(free_mib) H100s."""
    rows = {
        "index": [str(i) for i in range(len(free_mib))],
        "memory.free": [str(mib) for mib in free_mib],
        "memory.total": [str(H100_MIB)] * len(free_mib),
        "name": ["NVIDIA H100 80GB HBM3"] * len(free_mib),
        "driver_version": ["570.133.20"] * len(free_mib),
        "compute_cap": ["9.0"] * len(free_mib),
    }
    listing = "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d})" for i in range(len(free_mib)))
    script = f"""#!/usr/bin/env python3
import sys
rows = {rows!r}
args = sys.argv[1:]
if args == ["-L"]:
    print({listing!r})
    sys.exit(0)
query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
if query is None:
    sys.exit(0)  # --query-compute-apps: no process holds memory
units = "nounits" not in " ".join(args)
fields = query.split(",")
for index in range(len(rows["index"])):
    values = [rows[f][index] + (" MiB" if units and f.startswith("memory.") else "") for f in fields]
    print(", ".join(values))
"""
    directory.mkdir(parents=True, exist_ok=True)
    smi = directory / "nvidia-smi"
    smi.write_text(script)
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return smi


@pytest.fixture
def gpus(tmp_path, monkeypatch):
    """gpus(n, free_mib=None): this test's host has n recorded H100s (all free unless free_mib says otherwise)."""

    def install(count: int, free_mib: list[int] | None = None) -> None:
        recorded_smi(tmp_path / f"smi{count}", free_mib or [H100_MIB - 600] * count)
        monkeypatch.setenv("PATH", f"{tmp_path / f'smi{count}'}:{__import__('os').environ['PATH']}")
        monkeypatch.delenv("HF2TRITON_ASSUME_NO_GPU", raising=False)

    return install


def project(*models: dict):
    return project_spec(validate_config({"models": [copy.deepcopy(m) for m in models]}))


def refused(*models: dict) -> UserError:
    with pytest.raises(UserError) as info:
        validate_config({"models": [copy.deepcopy(m) for m in models]})
    return info.value


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_recorded_hosts_are_read_per_gpu(gpus, count):
    gpus(count, [1000 * (i + 1) for i in range(count)])
    assert host.has_gpu() and host.gpu_count() == count
    assert host.gpu_memory_table() == [(1000 * (i + 1) * 1024**2, H100_MIB * 1024**2) for i in range(count)]


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_gpus_all_places_instances_on_every_gpu_but_the_vllm_engine_s(count):
    encoder = {**ENCODER, "gpus": "all", "instances": 2}
    spec = project(encoder, {**LLM, "vllm": {"tensor_parallel_size": min(2, count)}})
    reserved = reserved_gpus(spec.models, True, count)
    assert reserved == frozenset(range(min(2, count)))
    embed = serving_values(spec.model("embed"), True, 16, gpu_count=count, reserved=reserved)
    # the encoder keeps off the engine's GPUs where others exist; on a host the engine fills, it shares them
    assert embed.gpus == (tuple(range(2, count)) or tuple(range(count)))
    config = build_model_config("embed", "feature-extraction", 8, 2, embed.kind, 100, {}, gpus=embed.gpus)
    (group,) = config.instance_group
    assert (group.count, list(group.gpus)) == (2, list(embed.gpus)), "two instances on each of its GPUs"
    llm = serving_values(spec.model("llm"), True, 16, gpu_count=count, reserved=reserved)
    assert llm.gpus == tuple(range(min(2, count)))


def test_explicit_gpus_and_the_defaults():
    assert gpu_placement(None, 1, "KIND_GPU", 8) == (0,), "left out: GPU 0, as before"
    assert gpu_placement((1, 3), 1, "KIND_GPU", 8) == (1, 3)
    assert gpu_placement("all", 1, "KIND_CPU", 8) == (), "a CPU model names no GPU"
    assert gpu_placement(None, 4, "KIND_GPU", 8) == (0, 1, 2, 3), "a vllm engine of tensor x pipeline 4: GPUs 0-3"
    spec = project({**ENCODER, "gpus": [1, 3]})
    assert spec.model("embed").gpus == (1, 3)
    assert serving_values(spec.model("embed"), True, 16, gpu_count=4).gpus == (1, 3)


def test_vllm_tensor_parallel_renders_one_instance_and_spans_its_gpus(tmp_path):
    from hf2triton.pipeline.render import model_parameters_for
    from hf2triton.serving.runtimes.vllm import engine_arguments, environment_defaults, visible_devices

    spec = project({**LLM, "gpus": [4, 5, 6, 7], "vllm": {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}})
    serving = serving_values(spec.model("llm"), True, 16, gpu_count=8)
    assert serving.gpus == (4, 5, 6, 7)
    saved = tmp_path / "llm"
    saved.mkdir()
    (saved / "config.json").write_text('{"max_position_embeddings": 4096}')
    params = model_parameters_for(serving, str(saved))
    assert (params.tensor_parallel_size, params.pipeline_parallel_size, params.vllm_gpus) == (2, 2, "4,5,6,7")
    strings = params.to_strings()
    assert strings["vllm_gpus"] == "4,5,6,7" and strings["tensor_parallel_size"] == "2"
    arguments = engine_arguments(params)
    assert (arguments["tensor_parallel_size"], arguments["pipeline_parallel_size"]) == (2, 2)
    assert arguments["distributed_executor_backend"] == "mp"
    assert visible_devices(params, "cuda:4") == "4,5,6,7", "the engine's workers take GPUs 4-7 in order"
    assert environment_defaults()["NCCL_NVLS_ENABLE"] == "0", "NVLink multicast off (shared hosts)"
    single = project(LLM)
    one = model_parameters_for(serving_values(single.model("llm"), True, 16, gpu_count=8), str(saved))
    assert "tensor_parallel_size" not in engine_arguments(one) and visible_devices(one, "cuda:0") == "0"
    config = build_model_config("llm", "text-generation", 0, 1, "KIND_GPU", 0, strings, streaming=True, gpus=serving.gpus[:1])
    assert [list(g.gpus) for g in config.instance_group] == [[4]], "Triton starts the one instance on its first GPU"
    assert config_gpus(config) == (4, 5, 6, 7), "what the published manifest records"


def test_bad_gpu_settings_are_one_clear_line():
    error = refused({**ENCODER, "device": "cpu", "gpus": [0, 1]})
    assert "config.models[0].gpus = [0, 1]: the model runs on the CPU" in error.message and "device: gpu" in error.fix
    error = refused({**LLM, "gpus": [0], "vllm": {"tensor_parallel_size": 2}})
    assert "a vllm engine spans tensor_parallel_size x pipeline_parallel_size = 2 GPU(s)" in error.message
    assert "gpus: [0, 1]" in error.fix
    assert "spans" in refused({**LLM, "gpus": "all"}).message
    assert "gpus" in refused({**ENCODER, "gpus": [0, 0]}).message, "a GPU named twice"
    assert "gpus" in refused({**ENCODER, "gpus": "some"}).message


def _footprints(*models: dict) -> list:
    return [m.footprint() for m in project(*models).models]


def _saved(tmp_path: Path, name: str, parameters: int) -> str:
    saved = tmp_path / name
    saved.mkdir(exist_ok=True)
    (saved / "hf2triton.json").write_text(f'{{"parameters": {parameters}}}')
    (saved / "config.json").write_text('{"hidden_size": 384, "num_attention_heads": 12, "max_position_embeddings": 512}')
    return str(saved)


def test_preflight_names_the_gpu_that_falls_short(tmp_path):
    models = _footprints({**ENCODER, "gpus": "all", "instances": 4})
    dirs = {"embed": _saved(tmp_path, "embed", 300_000_000)}  # 0.6 GB in float16 + a CUDA context: ~1.2 GB an instance
    memory = [(80 * GIB, 80 * GIB), (80 * GIB, 80 * GIB), (2 * GIB, 80 * GIB), (80 * GIB, 80 * GIB)]
    checks = {c["name"]: c for c in pf.gpu_checks(models, dirs, memory, held=0)}
    assert sorted(checks) == ["gpu-memory", "gpu-memory:1", "gpu-memory:2", "gpu-memory:3"], "one budget per GPU"
    assert [name for name, check in checks.items() if not check["ok"]] == ["gpu-memory:2"]
    assert (
        "on GPU 2, which has 2.0 GB free" in checks["gpu-memory:2"]["detail"] and "embed: 4 x (weights" in checks["gpu-memory:2"]["detail"]
    )
    assert "other gpus for some models" in checks["gpu-memory:2"]["fix"]
    missing = pf.gpu_checks(_footprints({**ENCODER, "gpus": [0, 5]}), dirs, memory, held=0)
    assert not missing[0]["ok"] and "placed on GPU 5, this host has 4 GPU(s) (0-3)" in missing[0]["detail"]


def test_preflight_counts_a_tensor_parallel_engine_on_each_gpu_it_spans(tmp_path):
    llm = {**LLM, "vllm": {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.9}}
    memory = [(79 * GIB, 80 * GIB)] * 2
    dirs = {"llm": _saved(tmp_path, "llm", 70_000_000_000)}  # 70B in bfloat16 / float16: 140 GB, 70 GB a GPU over 2
    checks = {c["name"]: c for c in pf.gpu_checks(_footprints(llm), dirs, memory, held=0)}
    assert checks["gpu-memory"]["ok"] and checks["gpu-memory:1"]["ok"], "0.9 of each 80 GB GPU: 72 GB, 79 GB free"
    assert "vLLM's engine takes 0.9 of the GPU's 80.0 GB" in checks["gpu-memory:1"]["detail"]
    assert checks["vllm-span:llm"]["ok"] and "= 65.2 GB each" in checks["vllm-span:llm"]["detail"]
    dirs = {"llm": _saved(tmp_path, "llm", 72_000_000_000)}  # 72B: 67.1 GB a GPU over 2
    tight = {**llm, "vllm": {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.8}}  # vLLM's share: 64 GB of each
    span = next(c for c in pf.gpu_checks(_footprints(tight), dirs, memory, held=0) if c["name"] == "vllm-span:llm")
    assert not span["ok"] and "over 2 GPUs (0, 1)" in span["detail"] and "tensor_parallel_size" in span["fix"]


def test_preflight_reads_the_recorded_host(gpus, tmp_path):
    """run_preflight on a recorded 2-GPU host: the budget comes from nvidia-smi, one check per GPU used."""
    from hf2triton.triton.settings import Settings

    gpus(2, [40_000, 1_000])
    spec = project({**ENCODER, "gpus": "all"})
    settings = Settings.of(spec.server, spec.names, str(tmp_path / "work"))
    dirs = {"embed": _saved(tmp_path, "embed", 1_000_000_000)}
    with pytest.raises(UserError) as info:
        pf.run_preflight([m.footprint() for m in spec.models], settings, str(tmp_path / "work"), dirs, True, str(tmp_path / "p.json"))
    assert "need 2.5 GB at their limits on GPU 1, which has 1000.0 MB free" in info.value.message, info.value.message
    assert "GPU 0" not in info.value.message, "GPU 0 (40 GB free) passes"


def test_kubernetes_asks_for_the_published_gpu_count():
    from hf2triton.deploy.k8s import manifests, pod_gpus, resources

    spec = project({**ENCODER, "gpus": [0, 1, 2]}, {**LLM, "vllm": {"tensor_parallel_size": 4}})
    assert pod_gpus(spec.models) == 4, "the engine's 4 GPUs"
    assert pod_gpus(spec.models, published=8) == 8, "the published repository's record wins"
    assert resources(spec.models, {}, 8)["limits"]["nvidia.com/gpu"] == 8
    assert "nvidia.com/gpu" not in resources(project({**ENCODER, "device": "cpu"}).models, {})["limits"]
    documents = manifests(spec, "s3://bucket/prefix", gpus=8)
    limits = [
        doc["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        for doc in documents["triton.yaml"]
        if doc["kind"] == "Deployment"
    ]
    assert limits and limits[0]["nvidia.com/gpu"] == 8
