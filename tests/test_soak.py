"""The soak tool's short variant (30 s, concurrency 32) against a live server of tiny models."""

from __future__ import annotations

import pytest

from hf2triton.perf.soak import render_markdown, run_soak

pytestmark = pytest.mark.integration


def test_short_soak_has_no_unexpected_errors(tiny_workflow):
    settings = tiny_workflow.settings()
    models = {"feature-extraction": "embed", "text-generation": "generate", "text-classification": "classify"}
    result = run_soak(settings.url("grpc_port"), models, tiny_workflow.state()["pid"], duration_s=30, concurrency=32, interval_s=10)
    print(render_markdown({**result}))
    assert result["requests"] > 100
    assert result["unexpected_errors"] == 0, result["unexpected_examples"]
    assert len(result["intervals"]) >= 3
    for interval in result["intervals"]:
        assert set(interval) == {"interval", "requests", "good_ok", "bad_rejected", "unexpected", "p50_ms", "p99_ms", "rss_bytes"}
        assert interval["rss_bytes"] > 0
    assert sum(i["bad_rejected"] for i in result["intervals"]) > 0, "bad requests were part of the mix and were rejected"
    # spread = max / median of the intervals' p99: defined (latencies were measured) and no interval stalled
    assert result["p99_spread"] is not None and 1.0 <= result["p99_spread"] < 20, result["intervals"]
