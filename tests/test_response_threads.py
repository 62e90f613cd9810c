"""Several response threads (generation.response_threads; a 16-core GPU host gets 4 by default) on a real
tritonserver: streams that finish hundreds of times a second while the first thread polls Triton for gone clients.
Asking about a request whose final response was already sent (python_backend deletes its response factory with it)
made tritonserver read freed memory: with 32 clients of 2-token streams it died within seconds and every later
request failed (on the H200, behind backend vllm, as here behind the torch batcher). Every stream here ends with its
final event, and the server is still there after it."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from hf2triton.triton import client
from tests.helpers import make_workflow, on_test_backend, tiny_model_entries

pytestmark = pytest.mark.integration

CLIENTS = 32


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_models):
    entries = [e for e in tiny_model_entries(tiny_models) if e["name"] == "generate"]
    entries[0]["generation"] = {"max_new_tokens": 2, "max_sequences": CLIENTS, "max_queue": CLIENTS, "response_threads": 4}
    workflow = make_workflow(tmp_path_factory.mktemp("response-threads"), on_test_backend(entries))
    workflow.run("serve")
    yield workflow
    workflow.stop()


def hammer(url: str, seconds: float) -> tuple[int, list[str]]:
    """CLIENTS closed loops of 2-token generate_stream requests: (streams that ended with their final event, failures)."""
    body = json.dumps({"text": "Hi", "max_new_tokens": 2}).encode()
    finished, failures = [], []
    stop_at = time.monotonic() + seconds

    def loop() -> None:
        while time.monotonic() < stop_at and not failures:
            request = urllib.request.Request(url, data=body, headers=client.key_headers(), method="POST")  # noqa: S310
            try:
                with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
                    events = [json.loads(line[5:]) for line in response.read().decode().splitlines() if line.startswith("data:")]
            except urllib.error.HTTPError as err:
                failures.append(f"HTTP {err.code}: {err.read().decode()[:300]}")
                return
            except Exception as err:  # noqa: BLE001 - recorded: the test fails on it
                failures.append(f"{type(err).__name__}: {err}")
                return
            if not events or events[-1].get("finish_reason") not in ("length", "stop"):
                failures.append(str(events)[:300])
            finished.append(1)

    threads = [threading.Thread(target=loop) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 60)
    return len(finished), failures


def test_short_streams_back_to_back_keep_the_server_up(served):
    settings = served.settings()
    finished, failures = hammer(f"http://{settings.url()}/v2/models/generate/generate_stream", seconds=10)
    assert not failures, failures[:3]
    assert finished > 200, finished
    streamed = client.stream_generate(settings.url("grpc_port"), "generate", "Hello", {"max_new_tokens": 2})
    assert streamed["finish_reason"] in ("length", "stop")
