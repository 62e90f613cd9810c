"""TensorRT stage: what can be checked without TensorRT (profiles, cache keys, the refusal before any
work), and the real build wherever tensorrt and a CUDA GPU import."""

from __future__ import annotations

import importlib.util

import pytest

from hf2triton.errors import UserError
from hf2triton.pipeline.tensorrt import Profile, cache_key, engine_staleness, profile_shapes, require_tensorrt, tensorrt_version
from hf2triton.specs import ModelSpec
from tests.helpers import ROOT, make_workflow


def test_profile_covers_batch_and_sequence_range():
    profiles = profile_shapes(["input_ids", "attention_mask"], max_batch_size=32, max_length=512)
    assert [p.name for p in profiles] == ["input_ids", "attention_mask"]
    assert profiles[0] == Profile("input_ids", (1, 1), (32, 128), (32, 512))
    short = profile_shapes(["input_ids"], max_batch_size=0, max_length=64)[0]
    assert short.min == (1, 1) and short.opt == (1, 64) and short.max == (1, 64)


def test_cache_key_changes_with_version_gpu_graph_and_shapes():
    profiles = profile_shapes(["input_ids"], 8, 128)
    base = cache_key("10.13.0", "NVIDIA H200", "abc", profiles)
    assert base == cache_key("10.13.0", "NVIDIA H200", "abc", profiles)
    assert (
        len(
            {
                base,
                cache_key("11.0.0", "NVIDIA H200", "abc", profiles),
                cache_key("10.13.0", "NVIDIA A100", "abc", profiles),
                cache_key("10.13.0", "NVIDIA H200", "abd", profiles),
                cache_key("10.13.0", "NVIDIA H200", "abc", profile_shapes(["input_ids"], 16, 128)),
            }
        )
        == 5
    )


def test_engine_record_is_read_a_copied_engine_is_stale(tmp_path):
    """Regression: engine.json (TensorRT version, GPU) was written but never read."""
    engine = tmp_path / "engine.plan"
    engine.write_bytes(b"plan")
    assert "missing" in engine_staleness(engine, "10.13.0", "NVIDIA H200")
    (tmp_path / "engine.json").write_text('{"tensorrt": "10.13.0", "gpu": "NVIDIA H200"}')
    assert engine_staleness(engine, "10.13.0", "NVIDIA H200") is None
    assert "built with TensorRT 10.13.0, installed is 11.0.0" in engine_staleness(engine, "11.0.0", "NVIDIA H200")
    assert "this host has 'NVIDIA A100'" in engine_staleness(engine, "10.13.0", "NVIDIA A100")


def test_tensorrt_rule_reruns_when_tensorrt_or_gpu_change():
    """Regression: the TensorRT version and the GPU name are params of rule tensorrt_engine."""
    rule = (ROOT / "rules" / "export.smk").read_text().split("rule tensorrt_engine:")[1]
    assert "tensorrt=tensorrt_version()" in rule and "gpu_name=GPU_NAME" in rule


@pytest.mark.skipif(tensorrt_version() is not None, reason="TensorRT is installed here; the refusal path is for hosts without it")
def test_backend_tensorrt_refused_clearly_without_tensorrt():
    with pytest.raises(UserError) as info:
        require_tensorrt([ModelSpec(name="m", source="org/m", task="feature-extraction", backend="tensorrt")], gpu_available=False)
    message = info.value.render()
    assert "TensorRT not installed / no CUDA GPU" in message and "use backend: onnx or python" in message
    require_tensorrt(
        [ModelSpec(name="m", source="org/m", task="feature-extraction", backend="onnx")], gpu_available=False
    )  # other backends are not affected


def test_tensorrt_refusal_stops_the_workflow_before_any_work(tmp_path, tiny_models):
    if tensorrt_version() is not None:
        pytest.skip("TensorRT is installed here")
    workflow = make_workflow(
        tmp_path / "w",
        [{"name": "trt", "source": str(tiny_models["feature-extraction"]), "task": "feature-extraction", "backend": "tensorrt"}],
    )
    result = workflow.run("serve", check=False)
    assert result.returncode == 1 and "TensorRT not installed" in result.stderr and "Traceback" not in result.stderr
    assert not (workflow.directory / ".hf2triton").exists()


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is None or not _cuda(), reason="needs the tensorrt package and a CUDA GPU (not on CPU CI)"
)
def test_build_engine_from_tiny_export(tmp_path, tiny_models):
    from hf2triton.pipeline.export import export_onnx_step
    from hf2triton.pipeline.tensorrt import build_engine

    export_onnx_step(str(tiny_models["feature-extraction"]), "feature-extraction", 17, "none", "none", str(tmp_path / "onnx"))
    record = build_engine(str(tmp_path / "onnx"), 4, 128, str(tmp_path / "engine.plan"))
    assert (tmp_path / "engine.plan").stat().st_size > 0 and record["cache_key"]
