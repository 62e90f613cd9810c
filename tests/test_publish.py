"""Issue 26 #1-2: publish the validated repository to object storage and serve replicas from it.

A real S3-compatible server (moto's, from PyPI) runs on the loopback for the module; the real workflow publishes
through Snakemake's S3 storage plugin; a replica (`python -m hf2triton replica`) fetches the published repository into
its own directory, starts a tritonserver of its own (its own ports and work directory) and validates it with the
same checks as `make serve`. Triton's own s3:// repository support is exercised too, against the same server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from hf2triton import host
from hf2triton.errors import UserError
from tests.helpers import BIN, ROOT, make_workflow, server_block, tiny_model_entries

pytestmark = pytest.mark.integration

BUCKET = "hf2triton-published"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test-key-id", "AWS_SECRET_ACCESS_KEY": "test-secret", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    """moto's S3 server on a free loopback port, with test credentials in this process's environment."""
    port = host.free_ports(1)[0]
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "w")  # noqa: SIM115 - open for the server's lifetime
    server = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2)  # noqa: S310 - our own loopback server
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError(f"moto's S3 server did not start: {Path(log.name).read_text()[-2000:]}") from None
            time.sleep(0.3)
    saved = {key: os.environ.get(key) for key in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    yield endpoint
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.terminate()
    server.wait(timeout=30)
    log.close()


@pytest.fixture(scope="module")
def published(tmp_path_factory, tiny_models, s3_endpoint):
    """The tiny embedding (torch) and classification (ONNX) models served, validated and published."""
    entries = [e for e in tiny_model_entries(tiny_models, classify={"backend": "onnx"}) if e["name"] in ("embed", "classify")]
    workflow = make_workflow(tmp_path_factory.mktemp("publisher"), entries)
    workflow.config["publish"] = {"url": f"s3://{BUCKET}/team/v1", "endpoint_url": s3_endpoint}
    workflow.first_run = workflow.run("publish")
    workflow.stop()  # the replicas serve without the machine that built it
    yield workflow


def s3_objects(endpoint: str, prefix: str) -> dict[str, bytes]:
    from hf2triton.deploy.publish import s3_client

    client = s3_client(endpoint)
    keys = [
        item["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        for item in page.get("Contents", [])
    ]
    return {key: client.get_object(Bucket=BUCKET, Key=key)["Body"].read() for key in keys}


def test_publish_uploads_portable_models_a_manifest_and_the_report(published, s3_endpoint):
    assert {"publish_model", "publish"} <= set(published.jobs_run(published.first_run))
    objects = s3_objects(s3_endpoint, "team/v1/")
    names = set(objects)
    assert {"team/v1/manifest.json", "team/v1/validation.md", "team/v1/model_repository/embed/config.pbtxt"} <= names
    assert "team/v1/model_repository/embed/1/pretrained/config.json" in names, "the weights travel inside the model"
    assert "team/v1/model_repository/classify/1/onnx/model.onnx" in names
    manifest = json.loads(objects["team/v1/manifest.json"])
    assert manifest["validation"]["ok"] and set(manifest["models"]) == {"embed", "classify"}
    assert manifest["models"]["classify"]["backend"] == "onnx" and manifest["packages"]["transformers"]
    embed_files = manifest["models"]["embed"]["files"]
    assert all(len(f["sha256"]) == 64 for f in embed_files.values()) and "1/model.py" in embed_files
    config = objects["team/v1/model_repository/classify/config.pbtxt"].decode()
    assert 'string_value: "pretrained"' in config and 'string_value: "onnx"' in config
    # no path of the building machine in anything published (weights are binary: the text files are what names paths)
    machine = [str(published.directory.resolve()), str(published.work.resolve()), str(ROOT), str(Path.home())]
    for key, body in objects.items():
        if key.endswith((".pbtxt", ".py", ".json", ".txt", ".md", ".jinja")):
            text = body.decode("utf-8", "replace")
            assert not [p for p in machine if p in text], (key, [p for p in machine if p in text])


def test_publish_again_is_incremental(published):
    again = published.run("publish")
    assert "publish_model" not in published.jobs_run(again), again.stdout[-2000:]


URL = f"s3://{BUCKET}/team/v1"


def replica(work: Path, url: str, endpoint: str, *extra: str, check: bool = True, block: dict | None = None) -> subprocess.CompletedProcess:
    block = block or server_block()
    ports = ["--http-port", str(block["http_port"]), "--grpc-port", str(block["grpc_port"]), "--metrics-port", str(block["metrics_port"])]
    done = subprocess.run(
        [sys.executable, "-m", "hf2triton", "replica", url, "--work", str(work), "--endpoint-url", endpoint, *ports, *extra],
        capture_output=True, text=True, timeout=600, cwd=ROOT, check=False,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"},
    )  # fmt: skip
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


@pytest.fixture(scope="module")
def replicas(published, s3_endpoint, tmp_path_factory):
    """Two replicas of the published repository, each in its own directory (nothing of the publisher's) with its
    own tritonserver and ports: [(work, ports, the replica command's output)]."""
    base = tmp_path_factory.mktemp("replicas")
    started = []
    try:
        for name in ("replica-one", "replica-two"):
            block = server_block()
            started.append((base / name, block, None))
            started[-1] = (base / name, block, replica(base / name, URL, s3_endpoint, block=block))
        yield started
    finally:
        for work, block, _ in started:
            replica(work, URL, s3_endpoint, "--stop", check=False, block=block)


def test_a_replica_on_another_path_fetches_serves_and_validates(replicas, s3_endpoint, tmp_path):
    spaced = replica(tmp_path / "replica one", URL, s3_endpoint, check=False)
    assert spaced.returncode == 1 and "contains a space" in spaced.stderr and "Traceback" not in spaced.stderr
    assert not (tmp_path / "replica one").exists(), "refused before anything was downloaded"
    for work, _, done in replicas:
        assert "validation PASS" in done.stdout
        report = json.loads((work / "validation" / "report.json").read_text())
        assert report["ok"] and set(report["models"]) == {"embed", "classify"}
        for name, model in report["models"].items():
            names = {c["name"] for c in model["checks"]}
            assert {"served config equals rendered", "served equals in-process"} <= names, name
        assert any(c["name"].startswith("parity") for c in report["models"]["classify"]["checks"]), "the ONNX model met its parity gate"


def successes(block: dict, model: str) -> int:
    from hf2triton.triton import client

    status, stats = client.http_get(f"http://127.0.0.1:{block['http_port']}/v2/models/{model}/stats", timeout=10)
    assert status == 200, stats
    return sum(int(entry["inference_stats"]["success"]["count"]) for entry in json.loads(stats)["model_stats"])


def counted_since(before: list[int], blocks: tuple[dict, ...], total: int) -> list[int]:
    """Embed requests each replica served since `before`, once they add up to `total` or 10 s have passed (a
    replica's statistics count a request just after its answer left)."""
    deadline = time.monotonic() + 10
    while True:
        served = [successes(block, "embed") - start for block, start in zip(blocks, before)]
        if sum(served) >= total or time.monotonic() > deadline:
            return served
        time.sleep(0.2)


def test_two_replicas_behind_one_gateway_share_the_load_and_one_going_down_is_skipped(replicas, s3_endpoint, tmp_path):
    """The gateway (two worker processes) over both replicas' gRPC addresses: every request is answered, both
    replicas serve some (gRPC round_robin), with the same embeddings; with one replica stopped all still succeed."""
    from hf2triton.triton import client

    (work_one, one, _), (work_two, two, _) = replicas
    port = host.free_ports(1)[0]
    grpc = f"127.0.0.1:{one['grpc_port']},127.0.0.1:{two['grpc_port']}"
    log = open(tmp_path / "gateway.log", "w")  # noqa: SIM115 - open for the gateway's lifetime
    gateway = subprocess.Popen(
        [sys.executable, "-m", "hf2triton.gateway", "--grpc", grpc, "--port", str(port), "--models", "embed,classify", "--workers", "2"],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={k: v for k, v in os.environ.items() if k != "HF2TRITON_API_KEY"},
    )  # fmt: skip

    def embed(text: str) -> list[float]:
        status, body = client.http_post(f"http://127.0.0.1:{port}/v1/embeddings", body={"model": "embed", "input": text}, timeout=30)
        assert status == 200, body
        return json.loads(body)["data"][0]["embedding"]

    try:
        deadline = time.monotonic() + 60
        while client.http_get(f"http://127.0.0.1:{port}/health", timeout=2)[0] != 200:
            assert gateway.poll() is None and time.monotonic() < deadline, (tmp_path / "gateway.log").read_text()[-3000:]
            time.sleep(0.3)
        before = [successes(one, "embed"), successes(two, "embed")]
        answers = [embed("the same sentence") for _ in range(24)]
        served = counted_since(before, (one, two), 24)
        assert sum(served) == 24 and min(served) > 0, f"requests per replica: {served}"
        assert max(abs(a - b) for answer in answers for a, b in zip(answer, answers[0])) < 1e-5, "both replicas answer alike"
        replica(work_two, URL, s3_endpoint, "--stop", block=two)
        for _ in range(10):
            embed("replica two is gone")
        assert counted_since([before[0] + served[0]], (one,), 10) == [10], "replica two is stopped: all on replica one"
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)
        log.close()


def test_a_tampered_object_or_a_missing_repository_is_refused(published, s3_endpoint, tmp_path):
    from hf2triton.deploy.publish import fetch_published, s3_client

    with pytest.raises(UserError, match="no published repository at s3://hf2triton-published/nothing"):
        fetch_published(f"s3://{BUCKET}/nothing", str(tmp_path / "a"), s3_endpoint)
    client = s3_client(s3_endpoint)
    source = "team/v1/model_repository/embed/1/model.py"
    client.copy_object(Bucket=BUCKET, CopySource={"Bucket": BUCKET, "Key": "team/v1/manifest.json"}, Key="team/v2/manifest.json")
    for key in s3_objects(s3_endpoint, "team/v1/model_repository/"):
        client.copy_object(Bucket=BUCKET, CopySource={"Bucket": BUCKET, "Key": key}, Key=key.replace("team/v1/", "team/v2/"))
    client.put_object(Bucket=BUCKET, Key=source.replace("v1", "v2"), Body=b"print('not what was validated')\n")
    with pytest.raises(UserError, match="published model embed .* does not match its manifest: 1/model.py"):
        fetch_published(f"s3://{BUCKET}/team/v2", str(tmp_path / "b"), s3_endpoint)
    assert not (tmp_path / "b").exists(), "nothing half-fetched is left to serve"


def test_publish_without_a_url_stops_at_once_with_the_fix(tmp_path, tiny_models):
    workflow = make_workflow(tmp_path / "unconfigured", tiny_model_entries(tiny_models)[:1])
    done = workflow.run("publish", check=False)
    assert done.returncode != 0
    assert "publish.url is not set" in done.stderr and "publish: {url: s3://BUCKET/PREFIX}" in done.stderr
    assert "fetch" not in workflow.jobs_run(done), "nothing was built first"
    assert "Traceback" not in done.stderr


def test_k8s_renders_valid_manifests_for_the_published_repository(published, s3_endpoint):
    """`snakemake k8s` after publish: the official container serves the S3 repository (Triton's own s3:// support
    with the endpoint), every object valid against the Kubernetes and KServe schemas."""
    import yaml

    from tests.test_k8s_manifests import validate

    published.run("k8s")
    out = published.directory / "results" / "k8s"
    documents = {f.name: list(yaml.safe_load_all(f.read_text())) for f in sorted(out.glob("*.yaml"))}
    assert {"triton.yaml", "kserve.yaml"} <= set(documents)
    for docs in documents.values():
        for document in docs:
            validate(document)
    triton = next(d for d in documents["triton.yaml"] if d["kind"] == "Deployment")
    args = " ".join(triton["spec"]["template"]["spec"]["containers"][0]["args"])
    assert f"s3://{s3_endpoint}/{BUCKET}/team/v1/model_repository" in args, args


def test_relative_parameters_resolve_against_the_version_directory_and_absolute_ones_stay():
    from hf2triton.serving.interface import ModelParameters

    published = ModelParameters(task="feature-extraction", backend="onnx", model_dir="pretrained", onnx_dir="onnx").located("/r/embed/1")
    assert (published.model_dir, published.onnx_dir, published.trt_engine) == ("/r/embed/1/pretrained", "/r/embed/1/onnx", "")
    rendered = ModelParameters(task="feature-extraction", model_dir="/work/models/embed/pretrained").located("/r/embed/1")
    assert rendered.model_dir == "/work/models/embed/pretrained"


def test_a_configured_execution_env_is_packed_once_and_published_inside_every_model(published, s3_endpoint, tmp_path):
    """publish.execution_env: the pinned file is packed once (rule execution_env) and every published model carries
    it, named by EXECUTION_ENV_PATH and hashed in its manifest. Built with this machine's Python here (the container's
    is python3.10, the default); that a packed environment runs the stub in a fresh tritonserver is
    tests/test_execution_env.py's."""
    import tarfile
    from importlib import metadata

    from hf2triton.integrity import MANIFEST

    requirements = tmp_path / "env.txt"
    requirements.write_text(f"# the models' packages\nnumpy=={metadata.version('numpy')}\npyjokes==0.8.3  # only in the env\n")
    base = str(Path(sys._base_executable).resolve())
    saved = dict(published.config["publish"])
    published.config["publish"].update(
        url=f"s3://{BUCKET}/team/env", execution_env=str(requirements), execution_env_python=base, execution_env_target=base
    )
    try:
        done = published.run("publish")
        assert published.jobs_run(done).count("execution_env") == 1, done.stdout[-2000:]
        objects = s3_objects(s3_endpoint, "team/env/model_repository/")
        for model in ("embed", "classify"):
            archive = objects[f"team/env/model_repository/{model}/python_env.tar.gz"]
            config = objects[f"team/env/model_repository/{model}/config.pbtxt"].decode()
            assert 'key: "EXECUTION_ENV_PATH"' in config and "$$TRITON_MODEL_DIRECTORY/python_env.tar.gz" in config, config
            assert "python_env.tar.gz" in objects[f"team/env/model_repository/{model}/{MANIFEST}"].decode()
        (tmp_path / "env.tar.gz").write_bytes(archive)
        with tarfile.open(tmp_path / "env.tar.gz") as packed:
            assert any("site-packages/pyjokes/" in name for name in packed.getnames())
        requirements.write_text("numpy\n")
        loose = published.run("publish", check=False)
        assert loose.returncode != 0 and "must be pinned (name==version): numpy" in loose.stderr and "Traceback" not in loose.stderr
    finally:
        published.config["publish"] = saved
