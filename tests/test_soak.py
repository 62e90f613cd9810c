"""The soak tool: its verdict from synthetic samples (unit), following the server's pid, and the short variant
(30 s, concurrency 32) against a live server of tiny models (integration)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from hf2triton.fsutil import atomic_write_json
from hf2triton.perf.soak import Sample, find_server_pid, memory_sample, render_markdown, run_soak, summarise
from hf2triton.specs import ServerSpec
from hf2triton.triton.settings import Settings

INTERVAL_KEYS = {
    "interval",
    "requests",
    "good_ok",
    "bad_rejected",
    "unexpected",
    "unreachable",
    "p50_ms",
    "p99_ms",
    "rss_bytes",
    "server_pid",
    "server_gone",
}
REFUSED = "[StatusCode.UNAVAILABLE] failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Connection refused"


def _result(samples, memory):
    result = summarise(samples, memory, start=0.0, interval_s=10, warmup_intervals=0)
    return {**result, "duration_s": 20, "concurrency": 1, "bad_share": 0.2}


def test_bad_requests_count_as_rejected_only_when_the_server_answered_them():
    """A dead server refuses every request: that used to count as "bad request correctly rejected"."""
    samples = [
        Sample(1, "embed", True, True, 5.0),
        Sample(2, "empty", False, False, 1.0, "[StatusCode.INVALID_ARGUMENT] text is empty", "StatusCode.INVALID_ARGUMENT"),
        Sample(3, "oversized", False, False, 1.0, "[400] text of 65537 bytes exceeds max_input_bytes=65536", "400"),
        # the server is gone: refused connections, for bad and good requests alike
        Sample(11, "empty", False, False, 0.1, REFUSED, "StatusCode.UNAVAILABLE"),
        Sample(12, "invalid-utf8", False, False, 0.1, "[StatusCode.UNAVAILABLE] Socket closed", "StatusCode.UNAVAILABLE"),
        Sample(13, "embed", True, False, 0.1, REFUSED, "StatusCode.UNAVAILABLE"),
        # answered, but not with the model's error for this kind: a crash, not a rejection
        Sample(14, "empty", False, False, 1.0, "[StatusCode.INTERNAL] Stub process 'embed_0_0' is not healthy.", "StatusCode.INTERNAL"),
        Sample(15, "invalid-utf8", False, True, 1.0),  # a bad request that succeeded
    ]
    memory = [memory_reading(0, 100, 1000), memory_reading(10, 100, 1000)]
    result = _result(samples, memory)
    first, second = result["intervals"]
    assert (first["good_ok"], first["bad_rejected"], first["unexpected"], first["unreachable"]) == (1, 2, 0, 0)
    assert (second["good_ok"], second["bad_rejected"], second["unexpected"], second["unreachable"]) == (0, 0, 5, 3)
    assert result["unexpected_errors"] == 5 and result["server_unreachable"] == 3
    assert not result["ok"]
    assert any("not healthy" in example for example in result["unexpected_examples"])
    assert any("succeeded but should have failed" in example for example in result["unexpected_examples"])
    assert all("Connection refused" in e or "Socket closed" in e for e in result["unreachable_examples"])
    text = render_markdown(result)
    assert "server unreachable: 3" in text and "- server unreachable: empty: [StatusCode.UNAVAILABLE]" in text


def memory_reading(at, pid, total):
    return {"at": at, "pid": pid, "total": total, "processes": {str(pid): total}}


def test_an_interval_without_a_server_says_so_instead_of_0_bytes():
    samples = [Sample(at, "embed", True, True, 5.0) for at in (1, 11, 21)]
    gone = {"at": 10, "pid": None, "total": None, "processes": {}}
    result = _result(samples, [memory_reading(0, 100, 1000), gone, memory_reading(20, 200, 1500)])
    assert [i["rss_bytes"] for i in result["intervals"]] == [1000, None, 1500]
    assert [i["server_gone"] for i in result["intervals"]] == [False, True, False]
    assert result["server_gone_intervals"] == [1] and result["server_pids"] == [100, 200]
    assert result["rss_growth_after_warmup"] == 0.0, "growth is measured within one server process, not across a restart"
    assert not result["ok"]
    text = render_markdown(result)
    assert "| server gone |" in text and "| 0 B |" not in text
    assert "server was gone in interval(s) 1" in text and "restarted during the soak (pids 100, 200)" in text
    assert memory_sample(5.0, None) == gone | {"at": 5.0}


def test_memory_follows_the_servers_current_pid(tmp_path):
    """The pid comes from the state file at every reading (a restart writes the new one there); until then a
    tritonserver process naming the repository is found in /proc; with neither, None (not 0 B)."""
    settings = Settings.of(ServerSpec(), ["embed"], str(tmp_path / "work"), str(tmp_path / "repository"))
    assert find_server_pid(settings) is None  # no state file, no server
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    # a fake "tritonserver" for this repository: argv[0] and --model-repository as the real one has them
    script = "sleep 60; :"  # '; :' keeps bash from exec-ing sleep (the command line must stay)
    command = f"exec -a /opt/tritonserver/bin/tritonserver bash -c '{script}' --model-repository={settings.repository}"
    fake = subprocess.Popen(["bash", "-c", command], start_new_session=True)
    try:
        atomic_write_json(settings.state_file, {"pid": first.pid, "cmdline": [sys.executable, "-c", "import time; time.sleep(60)"]})
        _wait_for_cmdline(first.pid)
        assert find_server_pid(settings) == first.pid
        assert memory_sample(0.0, first.pid)["total"] > 0
        first.kill()
        first.wait()
        _wait_for_cmdline(fake.pid, "tritonserver")
        assert find_server_pid(settings) == fake.pid, "the state file's pid is gone: the repository's tritonserver is found"
        atomic_write_json(settings.state_file, {"pid": fake.pid, "cmdline": ["something", "else"]})
        assert find_server_pid(settings) == fake.pid
        os.killpg(fake.pid, signal.SIGKILL)
        fake.wait()
        assert find_server_pid(settings) is None
        assert memory_sample(1.0, find_server_pid(settings))["total"] is None
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        if fake.poll() is None:
            os.killpg(fake.pid, signal.SIGKILL)
            fake.wait()


def _wait_for_cmdline(pid, word=""):
    import time

    from hf2triton import host

    for _ in range(100):
        cmd = host.process_cmdline(pid) or []
        if cmd and word in cmd[0] and cmd[0] != "bash":
            return
        time.sleep(0.05)


@pytest.mark.integration
def test_short_soak_has_no_unexpected_errors(tiny_workflow):
    settings = tiny_workflow.settings()
    models = {"feature-extraction": "embed", "text-generation": "generate", "text-classification": "classify"}
    result = run_soak(settings.url("grpc_port"), models, lambda: find_server_pid(settings), duration_s=30, concurrency=32, interval_s=10)
    print(render_markdown({**result}))
    assert result["requests"] > 100
    assert result["unexpected_errors"] == 0, result["unexpected_examples"] + result["unreachable_examples"]
    assert len(result["intervals"]) >= 3
    assert result["server_pids"] == [tiny_workflow.state()["pid"]]
    for interval in result["intervals"]:
        assert set(interval) == INTERVAL_KEYS
        assert interval["rss_bytes"] > 0 and not interval["server_gone"]
    assert sum(i["bad_rejected"] for i in result["intervals"]) > 0, "bad requests were part of the mix and were rejected"
    # spread = max / median of the intervals' p99: defined (latencies were measured) and no interval stalled
    assert result["p99_spread"] is not None and 1.0 <= result["p99_spread"] < 20, result["intervals"]
