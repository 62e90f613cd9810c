"""The real hub download path (huggingface_hub snapshot_download through hf2triton.pipeline.fetch) against a
hub-compatible server on 127.0.0.1: by repo id, pinned revision, missing repo, and a whole workflow run."""

from __future__ import annotations

import json
import shutil

import pytest

from hf2triton.config import load_config
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
CARDED_REPO = "testorg/tiny-carded"


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
    carded = tmp_path_factory.mktemp("carded")  # a model card whose front matter tags the repository
    shutil.copytree(tiny_models["feature-extraction"], carded, dirs_exist_ok=True)
    (carded / "README.md").write_text("---\nlicense: mit\npipeline_tag: sentence-similarity\n---\n# tiny\n")
    server.add_repo(CARDED_REPO, carded)
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


def test_task_from_the_model_cards_pipeline_tag(hub, tmp_path, monkeypatch):
    """A config without task: the hub's model info (its cardData, as the Hub serves it) gives the pipeline_tag."""
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    (tmp_path / "config.yaml").write_text(json.dumps({"models": [{"name": "m", "source": CARDED_REPO}], "paths": {"work": str(tmp_path)}}))
    model = load_config(tmp_path / "config.yaml")["models"][0]
    assert (model["task"], model["task_inferred_from"]) == (
        "feature-extraction",
        f"pipeline_tag 'sentence-similarity' in the hub's model info of {CARDED_REPO}@main",
    )


def test_unreachable_hub_retries_then_explains(tmp_path, monkeypatch):
    from hf2triton import host

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{host.free_port()}")
    monkeypatch.setenv("HF2TRITON_FETCH_RETRIES", "3")
    monkeypatch.setenv("HF2TRITON_FETCH_BACKOFF_S", "0.1")
    with pytest.raises(UserError) as info:
        fetch_step(REPO, "main", None, str(tmp_path / "cache"), str(tmp_path / "fetch.json"))
    assert "hub unreachable" in info.value.render() and "HF_ENDPOINT" in info.value.render()
    (tmp_path / "config.yaml").write_text(json.dumps({"models": [{"name": "m", "source": REPO}], "paths": {"work": str(tmp_path)}}))
    with pytest.raises(UserError) as info:  # a task to infer from the unreachable hub: the same reason, and task: as a way out
        load_config(tmp_path / "config.yaml")
    assert info.value.message.startswith("config.models[0].task: missing, and inferring it failed: hub unreachable")
    assert info.value.fix.startswith("write task: for it, or check the network")


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
