"""The shipped config.yaml end to end: real SmolLM2-135M-Instruct and all-MiniLM-L6-v2, offline."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml

from hf2triton import host
from hf2triton.triton.client import http_client
from tests.helpers import ROOT, Workflow, minilm_dir, server_block

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def default_workflow(tmp_path_factory):
    # Only server ports and the work directory are overridden: the models come from config.yaml (supervised, as shipped).
    config = {"server": {**server_block(), "supervise": True}, "paths": {"work": ".hf2triton"}, "openai": {"port": host.free_ports(1)[0]}}
    workflow = Workflow(tmp_path_factory.mktemp("default-config"), config)
    started = time.monotonic()
    workflow.first_run = workflow.run("serve", timeout=1500)
    workflow.first_run_s = time.monotonic() - started
    workflow.config["models"] = [{"name": "smollm2"}, {"name": "minilm"}]  # names only, for settings()
    yield workflow
    workflow.stop()


def test_default_config_serves_and_validates(default_workflow):
    report = default_workflow.report()
    assert report["ok"], report
    assert set(report["models"]) == {"smollm2", "minilm"}
    print(f"shipped config from nothing to validated server: {default_workflow.first_run_s:.0f} s")


def test_smollm2_knows_the_capital_of_france(default_workflow):
    from hf2triton.triton import client

    settings = default_workflow.settings()
    question = "What is the capital of France?"
    status, answer = client.http_generate(settings.url(), "smollm2", {"text": question, "stream": False})
    assert status == 200 and "Paris" in answer["text_output"], answer
    streamed = client.stream_generate(settings.url("grpc_port"), "smollm2", question)
    assert streamed["text"] == answer["text_output"] and len(streamed["pieces"]) > 1, "the same answer, arriving in pieces"
    chat = client.stream_generate(settings.url("grpc_port"), "smollm2", [{"role": "user", "content": question}])
    assert chat["text"] == answer["text_output"], "the chat form: the template applied in the server"


def test_openai_gateway_answers_paris_and_embeds_384_dims(default_workflow):
    """The shipped config enables the gateway: the official client against it."""
    from openai import OpenAI

    api = OpenAI(base_url=f"http://127.0.0.1:{default_workflow.config['openai']['port']}/v1", api_key="unused", max_retries=0)
    stream = api.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "What is the capital of France?"}], stream=True
    )
    assert "Paris" in "".join(event.choices[0].delta.content or "" for event in stream if event.choices)
    assert len(api.embeddings.create(model="minilm", input=["hi"]).data[0].embedding) == 384


def test_minilm_embeddings_match_in_process_sentence_embeddings(default_workflow):
    import torch
    from transformers import AutoModel, AutoTokenizer

    sentences = ["A man is eating food.", "Ein Mann isst Essen.", "The weather is lovely today in Paris!"]
    client = http_client(default_workflow.settings().url())
    text = httpclient.InferInput("text", [3, 1], "BYTES")
    text.set_data_from_numpy(np.array([[s.encode()] for s in sentences], dtype=np.object_))
    served = client.infer("minilm", [text]).as_numpy("embedding")
    tokenizer, model = AutoTokenizer.from_pretrained(minilm_dir()), AutoModel.from_pretrained(minilm_dir()).eval()
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    expected = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1).numpy()
    cosine = (served * expected).sum(1)
    assert served.shape == (3, 384) and cosine.min() > 0.9999, cosine


def test_default_models_switched_to_the_onnx_backend(default_workflow):
    """Both shipped models switched to backend onnx in the served directory, as a user edits config.yaml (SmolLM2
    with its GGUF's 4-bit blocks kept): only the exports and what follows them run -- the fetched and dequantised
    weights are kept -- then served, validated, parity with torch: the re-packed decoder, streamed by the continuous
    batcher (the default), says exactly what torch says. (Last in this module: it leaves the workflow on onnx.)"""
    shipped = yaml.safe_load((ROOT / "config.yaml").read_text())["models"]
    onnx = {"smollm2": {"backend": "onnx", "onnx": {"quantize": "gguf-blocks"}}, "minilm": {"backend": "onnx"}}
    default_workflow.config["models"] = [{**entry, **onnx[entry["name"]]} for entry in shipped]
    ran = default_workflow.jobs_run(default_workflow.run("serve", timeout=1500))
    assert ran.count("export_onnx") == 2 and not {"fetch", "pretrained"} & set(ran), ran
    report = default_workflow.report()
    assert report["ok"], report
    assert report["models"]["minilm"]["parity"]["cosine_min"] >= 0.999
    assert report["models"]["smollm2"]["streaming"]
    assert report["models"]["smollm2"]["parity"]["greedy_identical"] == report["models"]["smollm2"]["parity"]["prompts"]
    assert "Paris" in report["models"]["smollm2"]["sample"]["output"]
    export = json.loads((default_workflow.work / "models/smollm2/onnx/export.json").read_text())
    assert export["exporter"] == "genai-builder"  # auto: fused attention for decoders
    # 30 layers x (fused q/k/v, o, gate, up, down) in 4-bit blocks; not the Q8_0 head
    assert export["gguf_blocks"]["packed_4bit"] == 150 and export["gguf_blocks"]["kept_float32"] == 1
