"""The real hub download path (huggingface_hub snapshot_download through hf2triton.pipeline.fetch) against a
hub-compatible server on 127.0.0.1: by repo id, pinned revision, missing repo, and a whole workflow run."""

from __future__ import annotations

import json
import shutil

import pytest

from hf2triton.errors import UserError
from hf2triton.fsutil import sha256_file
from hf2triton.pipeline.fetch import fetch_step
from tests.helpers import make_workflow
from tests.hub_server import HubServer, olah_binary

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(olah_binary() is None, reason="olah (hub-compatible test server) not installed: `make test` puts it in .venv-hub"),
]
REPO = "testorg/tiny-embed"


@pytest.fixture(scope="module")
def hub(tmp_path_factory, tiny_models):
    server = HubServer(tmp_path_factory.mktemp("hub"))
    server.first_commit = server.add_repo(REPO, tiny_models["feature-extraction"])
    changed = tmp_path_factory.mktemp("changed")
    shutil.copytree(tiny_models["feature-extraction"], changed, dirs_exist_ok=True)
    config = json.loads((changed / "config.json").read_text())
    config["hf2triton_revision_marker"] = 2
    (changed / "config.json").write_text(json.dumps(config))
    server.second_commit = server.add_repo(REPO, changed)
    server.start()
    yield server
    server.stop()


def test_fetch_by_repo_id_records_commit_and_hashes(hub, tiny_models, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    record = fetch_step(REPO, "main", None, str(tmp_path / "cache"), str(tmp_path / "fetch.json"))
    assert record["kind"] == "hub" and record["resolved_revision"] == hub.second_commit
    assert {"config.json", "model.safetensors", "tokenizer.json", "1_Pooling/config.json"} <= set(record["files"])
    weights = record["files"]["model.safetensors"]["sha256"]
    assert weights == sha256_file(tiny_models["feature-extraction"] / "model.safetensors"), "byte-identical download"
    assert json.loads((tmp_path / "fetch.json").read_text()) == record


def test_pinned_revision(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    old = fetch_step(REPO, hub.first_commit, None, str(tmp_path / "cache"), str(tmp_path / "old.json"))
    new = fetch_step(REPO, "main", None, str(tmp_path / "cache"), str(tmp_path / "new.json"))
    assert old["resolved_revision"] == hub.first_commit
    assert "hf2triton_revision_marker" not in json.loads(open(f"{old['path']}/config.json").read())
    assert json.loads(open(f"{new['path']}/config.json").read())["hf2triton_revision_marker"] == 2


def test_missing_repo_is_explained_and_writes_nothing(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF2TRITON_FETCH_RETRIES", "1")
    with pytest.raises(UserError) as info:
        fetch_step("testorg/does-not-exist", "main", None, str(tmp_path / "cache"), str(tmp_path / "fetch.json"))
    assert "not found" in info.value.render() and "HF_TOKEN" in info.value.render()
    assert not (tmp_path / "fetch.json").exists()


def test_unreachable_hub_retries_then_explains(tmp_path, monkeypatch):
    from hf2triton import host

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{host.free_port()}")
    monkeypatch.setenv("HF2TRITON_FETCH_RETRIES", "3")
    monkeypatch.setenv("HF2TRITON_FETCH_BACKOFF_S", "0.1")
    with pytest.raises(UserError) as info:
        fetch_step(REPO, "main", None, str(tmp_path / "cache"), str(tmp_path / "fetch.json"))
    assert "hub unreachable" in info.value.render() and "HF_ENDPOINT" in info.value.render()


def test_workflow_serves_a_hub_model(hub, tmp_path):
    workflow = make_workflow(tmp_path / "w", [{"name": "hubembed", "source": REPO, "revision": "main", "task": "feature-extraction"}])
    workflow.env["HF_ENDPOINT"] = hub.endpoint
    try:
        workflow.run("serve")
        report = workflow.report()
        assert report["ok"] and report["models"]["hubembed"]["ok"]
        record = json.loads((workflow.directory / ".hf2triton/models/hubembed/fetch.json").read_text())
        assert record["resolved_revision"] == hub.second_commit
    finally:
        workflow.stop()
