"""The image tasks (image-classification: ViT, ConvNeXT; zero-shot-image-classification: CLIP, SigLIP) on tiny random
models built here: the engines equal transformers' own pipeline in-process (labels, order, scores), the image guards
(pixels bounded from the header, non-images refused), the request options, config refusals, task inference, the rendered
interface; and one real serve of ViT + CLIP + SigLIP: validation PASS, tritonclient HTTP / gRPC answers equal the
pipeline's, bad images refused per request, the gateway's KServe V1 predict, `python -m hf2triton infer IMAGE`.

The tiny CLIP and SigLIP use a BERT WordPiece tokenizer (the MiniLM one the other tests use; no token_type_ids): a
CLIPTokenizer's BPE files or SigLIP's sentencepiece model cannot be had offline, and the pipeline only calls the
tokenizer, whatever it is."""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from hf2triton.pipeline.image_probes import ZERO_SHOT_LABELS, encoded, probe_images, synthetic_image
from hf2triton.pipeline.pipeline_answers import compare_entities, entity_lists, pipeline_image_answers
from hf2triton.serving import images as image_inputs
from hf2triton.serving import inputs, interface
from hf2triton.triton import client
from tests.helpers import ROOT, make_workflow, minilm_dir, passed_checks
from tests.media_models import LABELS, build_image_models

IC, ZS = interface.IMAGE_CLASSIFICATION, interface.ZERO_SHOT_IMAGE_CLASSIFICATION
SMALL_LIMIT = 100_000  # the served models' max_image_pixels: a 400 x 400 image is over it


@pytest.fixture(scope="module")
def image_models(tmp_path_factory) -> dict[str, Path]:
    return build_image_models(tmp_path_factory.mktemp("image-models"))


def _same(served: np.ndarray | dict, reference: np.ndarray | dict) -> dict:
    """Per image the same labels in the same order, scores within 1e-3 (an answer: its LABELS rows, or the dict of them)."""
    served, reference = (value[interface.LABELS] if isinstance(value, dict) else value for value in (served, reference))
    result = compare_entities(entity_lists(served), entity_lists(reference))
    assert result["ok"], (result, served, reference)
    return result


def test_engines_equal_the_pipeline_in_process(image_models):
    from hf2triton.serving.tasks.vision import ImageClassificationEngine, ZeroShotImageEngine

    images = probe_images()
    for name in ("vit", "convnext"):
        engine = ImageClassificationEngine(str(image_models[name]))
        _same(engine.run(images)[interface.LABELS], pipeline_image_answers(IC, str(image_models[name]), images))
        for options in ({"top_k": 2}, {"function_to_apply": "sigmoid"}, {"function_to_apply": "none", "top_k": 1000}):
            reference = pipeline_image_answers(IC, str(image_models[name]), images, **options)
            _same(engine.run(images, **options)[interface.LABELS], reference)
        alone = engine.run(images[1:2])[interface.LABELS]  # batched with others or alone: the same answer
        _same(alone, engine.run(images)[interface.LABELS][1:2])
    first = json.loads(ImageClassificationEngine(str(image_models["vit"])).run(images)[interface.LABELS][0])
    assert [set(item) for item in first] == [{"label", "score"}] * 3 and {i["label"] for i in first} == set(LABELS.values())
    for name in ("clip", "siglip"):
        engine = ZeroShotImageEngine(str(image_models[name]))
        for labels, template in ((ZERO_SHOT_LABELS, interface.DEFAULT_HYPOTHESIS_TEMPLATE), (("x", "a much longer label"), "{} here")):
            served = engine.run(images, candidate_labels=labels, hypothesis_template=template)[interface.LABELS]
            options = {"candidate_labels": list(labels), "hypothesis_template": template}
            _same(served, pipeline_image_answers(ZS, str(image_models[name]), images, **options))
        scores = [item["score"] for item in json.loads(served[0])]
        assert scores == sorted(scores, reverse=True)
        assert (abs(sum(scores) - 1) < 1e-5) == (name == "clip")  # softmax over the labels; SigLIP: sigmoid per label


def test_zero_shot_embeddings_equal_the_model_in_process(image_models):
    """CLIP's and SigLIP's image and text features, normalised, as served (batched) and each row alone in-process."""
    from hf2triton.pipeline.pipeline_answers import compare_embeddings, dual_encoder_embeddings
    from hf2triton.serving.tasks.vision import ZeroShotImageEngine

    texts = ["a red square", "x", "a long text " * 40]  # the last: CLIP's cut to its 64-token context
    for name in ("clip", "siglip"):
        engine = ZeroShotImageEngine(str(image_models[name]))
        for rows, kind in ((probe_images(), "images"), (texts, "texts")):
            served = engine.run(rows, embed=kind)
            reference = dual_encoder_embeddings(str(image_models[name]), rows, kind == "texts")
            assert compare_embeddings(served, reference, 0.99999)["ok"], (name, kind)
            assert served[interface.PROMPT_TOKENS].tolist() == reference[interface.PROMPT_TOKENS].tolist()
            assert np.allclose(np.linalg.norm(served[interface.EMBEDDING], axis=1), 1, atol=1e-5)
        assert engine.run(texts, embed="texts")[interface.PROMPT_TOKENS].tolist()[-1] == 64


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height over one tiny compressed row: a decompression bomb's shape."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def test_images_are_bounded_before_decoding_and_non_images_refused():
    png, jpeg = probe_images()[0], probe_images()[1]
    decoded = image_inputs.decode_images(np.array([[png], [jpeg]], dtype=np.object_), 10_000)
    assert [(image.mode, image.size) for image in decoded] == [("RGB", (48, 40)), ("RGB", (64, 64))]
    rgba = image_inputs.decode_image(probe_images()[2], 10_000)
    assert rgba.mode == "RGB"
    with pytest.raises(inputs.RequestError, match=r"image 0 is 48x40 = 1920 pixels, more than max_image_pixels=1000"):
        image_inputs.decode_image(png, 1000)
    with pytest.raises(inputs.RequestError, match="image 0 is more than max_image_pixels=25000000 .*10000000000 pixels"):
        image_inputs.decode_image(_png_header_only(100_000, 100_000), interface.DEFAULTS.max_image_pixels)
    with pytest.raises(inputs.RequestError, match=r"image 1 \(11 bytes, starting b'hello world'\) is not an image"):
        image_inputs.decode_images(np.array([[png], [b"hello world"]], dtype=np.object_), 10_000)
    with pytest.raises(inputs.RequestError, match="could not be decoded"):
        image_inputs.decode_image(png[:60], 10_000)  # truncated
    with pytest.raises(inputs.RequestError, match="empty"):
        image_inputs.decode_image(b"", 10_000)


def test_request_options():
    assert inputs.image_classification_options(None, None) == {interface.TOP_K: 5, interface.FUNCTION_TO_APPLY: "default"}
    top_k, function = np.array([[3]], dtype=np.int32), np.array([[b"Sigmoid"]], dtype=np.object_)
    assert inputs.image_classification_options(top_k, function) == {interface.TOP_K: 3, interface.FUNCTION_TO_APPLY: "sigmoid"}
    with pytest.raises(inputs.RequestError, match="function_to_apply='tanh' is not allowed: use one of default, sigmoid"):
        inputs.image_classification_options(None, np.array([[b"tanh"]], dtype=np.object_))
    with pytest.raises(inputs.RequestError, match="top_k=0 must be"):
        inputs.image_classification_options(np.array([[0]], dtype=np.int32), None)
    labels = np.array([[b'["cat", "dog"]']], dtype=np.object_)
    expected = {interface.CANDIDATE_LABELS: ("cat", "dog"), interface.HYPOTHESIS_TEMPLATE: "This is a photo of {}."}
    assert inputs.zero_shot_image_options(labels, None, 1000) == expected
    with pytest.raises(inputs.RequestError, match="input 'candidate_labels' is missing"):
        inputs.zero_shot_image_options(None, None, 1000)
    for bad in (b"cat,dog", b"[]", b'["cat", ""]', b"[1, 2]"):
        with pytest.raises(inputs.RequestError, match="candidate_labels must be a JSON list of non-empty strings"):
            inputs.zero_shot_image_options(np.array([[bad]], dtype=np.object_), None, 1000)
    with pytest.raises(inputs.RequestError, match="must hold {}"):
        inputs.zero_shot_image_options(labels, np.array([[b"no slot"]], dtype=np.object_), 1000)
    with pytest.raises(inputs.RequestError, match="only one {}"):
        inputs.zero_shot_image_options(labels, np.array([[b"{} {0} {x}"]], dtype=np.object_), 1000)


def test_config_refuses_tensorrt_and_renders_the_image_interface(image_models, tmp_path):
    from tritonclient.grpc import model_config_pb2 as mc

    from hf2triton.config import load_config
    from hf2triton.errors import UserError
    from hf2triton.pipeline.render import render_model, serving_files
    from hf2triton.specs import ModelSpec, serving_values
    from hf2triton.triton.modelconfig import read_model_config

    path = tmp_path / "config.yaml"
    for task, model in ((IC, "vit"), (ZS, "clip")):
        path.write_text(json.dumps({"models": [{"name": "m", "source": str(image_models[model]), "task": task, "backend": "tensorrt"}]}))
        with pytest.raises(UserError) as refused:  # backend onnx: tests/test_onnx_media.py
            load_config(path)
        assert f"not built for {task}" in str(refused.value) and "use backend: onnx (or python)" in refused.value.fix
        path.write_text(json.dumps({"models": [{"name": "m", "source": str(image_models[model]), "max_image_pixels": 5000}]}))
        loaded = load_config(path)["models"][0]
        assert loaded["task"] == task and loaded["max_image_pixels"] == 5000  # inferred from config.json's architectures
        spec = ModelSpec(name="m", source=str(image_models[model]), task=task, max_image_pixels=5000)
        serving = serving_values(spec, gpu_available=False, cpus=2)
        files = {str(p).split("serving/")[-1] for p in serving_files(serving)}
        assert {"tasks/vision.py", "images.py"} <= files and "runtimes/onnxruntime.py" not in files
        config = read_model_config(render_model(str(tmp_path / task), serving, str(image_models[model])) / "config.pbtxt")
        if task == IC:
            inputs_ = [("image", "TYPE_STRING", False), ("top_k", "TYPE_INT32", True), ("function_to_apply", "TYPE_STRING", True)]
            outputs = [("labels", [1])]
        else:  # labels, or embeddings of images (embed true) or of texts
            inputs_ = [
                ("image", "TYPE_STRING", True),
                ("candidate_labels", "TYPE_STRING", True),
                ("hypothesis_template", "TYPE_STRING", True),
            ]
            inputs_ += [("text", "TYPE_STRING", True), ("embed", "TYPE_BOOL", True)]
            outputs = [("labels", [1]), ("embedding", [-1]), ("prompt_tokens", [1])]
        assert [(t.name, mc.DataType.Name(t.data_type), t.optional) for t in config.input] == inputs_
        assert [(t.name, list(t.dims)) for t in config.output] == outputs
        assert config.parameters["max_image_pixels"].string_value == "5000" and "cuda_graphs" not in config.parameters


def test_tune_leaves_image_models_out_clearly(image_models, tmp_path):
    """tune's loads are texts (bench measures image models with images: perf.pipelines.media_load)."""
    from hf2triton.config import load_config, load_project
    from hf2triton.errors import UserError

    path = tmp_path / "config.yaml"
    models = [{"name": "vit", "source": str(image_models["vit"])}, {"name": "bert", "source": str(minilm_dir())}]
    path.write_text(json.dumps({"models": models}))
    assert [m.name for m in load_project(path).tuned_models()] == ["bert"]
    path.write_text(json.dumps({"models": models, "tune": {"models": ["vit"]}}))
    with pytest.raises(UserError, match="'vit' is an image or speech model"):
        load_config(path)


def test_task_inference_from_architectures_and_pipeline_tags():
    from hf2triton.task_inference import Evidence, infer_task

    for architecture, task in (
        ("ViTForImageClassification", IC),
        ("ConvNextForImageClassification", IC),
        ("DeiTForImageClassificationWithTeacher", IC),
        ("CLIPModel", ZS),
        ("SiglipModel", ZS),
        ("BertModel", interface.FEATURE_EXTRACTION),
    ):
        assert infer_task(Evidence(where="d", config={"architectures": [architecture]}))[0] == task
    for tag in (IC, ZS):
        assert infer_task(Evidence(where="d", pipeline_tag=tag, pipeline_tag_from="README.md"))[0] == tag


# ---------------------------------------------------------------- one real serve


@pytest.fixture(scope="module")
def served(tmp_path_factory, image_models):
    """ViT, CLIP and SigLIP served with the gateway (max_batch_size 4; images over SMALL_LIMIT pixels refused)."""
    from hf2triton import host

    entry = {"max_batch_size": 4, "max_image_pixels": SMALL_LIMIT}
    models = [{"name": name, "source": str(image_models[name]), **entry} for name in ("vit", "clip", "siglip")]  # tasks inferred
    workflow = make_workflow(tmp_path_factory.mktemp("image-workflow"), models)
    workflow.config["openai"] = {"enabled": True, "port": host.free_ports(1)[0]}
    workflow.run("serve")
    yield workflow
    workflow.stop()


def _triton(workflow, protocol: str):
    settings = workflow.settings()
    return client.http_client(settings.url("http_port")) if protocol == "http" else client.grpc_client(settings.url("grpc_port"))


def _infer_labels(workflow, protocol: str, name: str, images: list[bytes], options: dict | None = None) -> np.ndarray:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    module = httpclient if protocol == "http" else grpcclient
    triton = _triton(workflow, protocol)
    try:
        return (
            triton.infer(name, client.build_inputs(module, images, options, primary=interface.IMAGE)).as_numpy(interface.LABELS).reshape(-1)
        )
    finally:
        triton.close()


def _cli(workflow, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "hf2triton", "infer", "--grpc", workflow.settings().url("grpc_port"), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF2TRITON_CONFIG": ""}
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, check=False)


@pytest.mark.integration
def test_served_image_models_validate_and_answer_as_the_pipeline(served, image_models, tmp_path):
    for name in ("vit", "clip", "siglip"):
        required = {"http equals grpc", "served equals in-process"} | ({"embeddings equal in-process"} if name != "vit" else set())
        checks = passed_checks(served, name, required)
        assert "labels of 3 images as transformers' pipeline" in checks["served equals in-process"]["detail"]
    gateway = json.loads((served.directory / "results" / "validation" / "gateway.json").read_text())
    expected = {f"{n}: predict equals Triton" for n in ("vit", "clip", "siglip")} | {
        f"{n}: embeddings equal Triton" for n in ("clip", "siglip")
    }
    assert gateway["ok"] and {c["name"] for c in gateway["checks"]} == expected, gateway
    images = [*probe_images(), encoded(synthetic_image(40, 24, 3), "JPEG")]  # 4 images (PNG and JPEG) in one request
    for protocol in ("http", "grpc"):
        _same(
            _infer_labels(served, protocol, "vit", images, {interface.TOP_K: 2}),
            pipeline_image_answers(IC, str(image_models["vit"]), images, top_k=2),
        )
        for name in ("clip", "siglip"):
            options = {interface.CANDIDATE_LABELS: ["red", "blue"], interface.HYPOTHESIS_TEMPLATE: "a {} thing"}
            reference = pipeline_image_answers(
                ZS, str(image_models[name]), images, candidate_labels=["red", "blue"], hypothesis_template="a {} thing"
            )
            _same(_infer_labels(served, protocol, name, images, options), reference)
    # bad images: a clear error for that request; the model goes on serving
    import tritonclient.utils

    too_large = encoded(synthetic_image(400, 400, 0), "PNG")
    for bad, message in (
        (too_large, f"image 0 is 400x400 = 160000 pixels, more than max_image_pixels={SMALL_LIMIT}"),
        (_png_header_only(100_000, 100_000), "10000000000 pixels"),
        (b"not an image at all", "is not an image Pillow can read"),
    ):
        with pytest.raises(tritonclient.utils.InferenceServerException, match=message.replace("(", r"\(")):
            _infer_labels(served, "grpc", "vit", [bad])
    # concurrent requests (Triton batches their rows): a bad image fails its own request only
    from concurrent.futures import ThreadPoolExecutor

    def one(image: bytes) -> str:
        try:
            return _infer_labels(served, "http", "vit", [image])[0].decode()
        except tritonclient.utils.InferenceServerException as err:
            return f"error: {err}"

    sent = [*images, b"GIF89a broken", *images]
    with ThreadPoolExecutor(len(sent)) as pool:
        answers = list(pool.map(one, sent))
    assert answers[len(images)].startswith("error: ") and "image 0" in answers[len(images)], answers[len(images)]
    good = [answer.encode() for index, answer in enumerate(answers) if index != len(images)]
    _same(np.array(good, dtype=np.object_), pipeline_image_answers(IC, str(image_models["vit"]), [*images, *images]))
    with pytest.raises(tritonclient.utils.InferenceServerException, match="input 'candidate_labels' is missing"):
        _infer_labels(served, "http", "clip", images[:1])
    _same(_infer_labels(served, "http", "vit", images[:1]), pipeline_image_answers(IC, str(image_models["vit"]), images[:1]))

    # the gateway's KServe V1 predict: per instance its options (instance, then parameters, then the body)
    def predict(name: str, body: dict) -> tuple[int, dict]:
        status, text = client.http_post(
            f"http://127.0.0.1:{served.config['openai']['port']}/v1/models/{name}:predict", body=body, timeout=60
        )
        return status, json.loads(text)

    b64 = [base64.b64encode(image).decode() for image in images]
    wrapped = "\n".join(b64[1][i : i + 76] for i in range(0, len(b64[1]), 76))  # as `base64` writes it without -w0
    body = {
        "instances": [{"image_bytes": {"b64": b64[0]}}, {"b64": wrapped}, f"data:image/png;base64,{b64[2]}"],
        "parameters": {"top_k": 2},
    }
    status, answer = predict("vit", body)
    assert status == 200 and answer["predictions"] == [
        json.loads(row) for row in _infer_labels(served, "http", "vit", images[:3], {interface.TOP_K: 2})
    ]
    body = {
        "instances": [{"image_bytes": {"b64": b64[0]}}, {"image_bytes": {"b64": b64[1]}, "candidate_labels": ["x", "y", "z"]}],
        "parameters": {"candidate_labels": ["red", "blue"]},
    }
    status, answer = predict("clip", body)
    assert status == 200, answer
    first, second = (
        json.loads(_infer_labels(served, "http", "clip", [images[i]], {interface.CANDIDATE_LABELS: labels})[0])
        for i, labels in ((0, ["red", "blue"]), (1, ["x", "y", "z"]))
    )
    assert answer["predictions"] == [first, second]
    status, refused = predict("clip", {"instances": [{"image_bytes": {"b64": b64[0]}}]})
    assert status == 400 and refused["error"]["param"] == "candidate_labels", refused
    status, refused = predict("vit", {"instances": [{"image_bytes": {"b64": base64.b64encode(too_large).decode()}}]})
    assert status == 413 and "max_image_pixels" in refused["error"]["message"], refused
    status, refused = predict("vit", {"instances": [{"image_bytes": {"b64": "%%%"}}]})
    assert status == 400 and "not valid base64" in refused["error"]["message"], refused

    # the CLI: image files in, the pipeline's labels out
    files = []
    for index, image in enumerate(images[:2]):
        files.append(tmp_path / f"image{index}.{'png' if index == 0 else 'jpg'}")
        files[-1].write_bytes(image)
    printed = _cli(served, "clip", str(files[0]), "--labels", "red, blue", "--json")
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout) == json.loads(
        _infer_labels(served, "grpc", "clip", images[:1], {interface.CANDIDATE_LABELS: ["red", "blue"]})[0]
    )
    readable = _cli(served, "vit", *map(str, files), "--top-k", "2")
    assert readable.returncode == 0 and len(readable.stdout.strip().split("\n\n")) == 2, readable.stdout + readable.stderr
    refused = _cli(served, "clip", str(files[0]))
    assert refused.returncode != 0 and "--labels" in refused.stdout + refused.stderr
    missing = _cli(served, "vit", str(tmp_path / "nothing.png"))
    assert missing.returncode != 0 and "cannot read" in missing.stdout + missing.stderr


@pytest.mark.integration
def test_the_playground_classifies_a_picked_image(served, tmp_path):
    """The Images view in headless Chromium: a picked file is shown and classified by the zero-shot model; its labels
    (markup in one stays text) with score bars equal the predict endpoint's answer; no console errors."""
    from selenium.webdriver.support.ui import Select

    from tests.browser import console_errors, fill, start_chromium, text_of, wait_for

    browser = start_chromium()
    try:
        port = served.config["openai"]["port"]
        browser.get(f"http://127.0.0.1:{port}/playground/")
        tab = 'button[data-view="images"]'
        wait_for(browser, lambda: browser.execute_script(f"return !document.querySelector('{tab}').hidden"))
        browser.find_element("css selector", tab).click()
        Select(browser.find_element("id", "images-model")).select_by_value("clip")
        fill(browser, "images-labels", "red, <b>blue</b>")
        path = tmp_path / "picked.png"
        path.write_bytes(probe_images()[0])
        browser.find_element("id", "images-file").send_keys(str(path))
        wait_for(
            browser, lambda: (browser.execute_script("return document.getElementById('images-preview').src") or "").startswith("blob:")
        )
        browser.find_element("id", "images-send").click()
        wait_for(browser, lambda: len(browser.find_elements("css selector", "#images-labels-out li")) == 2)
        shown = [
            (item.find_element("css selector", ".token").text, float(item.get_attribute("data-score")))
            for item in browser.find_elements("css selector", "#images-labels-out li")
        ]
        expected = json.loads(
            _infer_labels(served, "http", "clip", probe_images()[:1], {interface.CANDIDATE_LABELS: ["red", "<b>blue</b>"]})[0]
        )
        assert shown == [(item["label"], item["score"]) for item in expected], (shown, expected)
        assert not browser.find_elements("css selector", "#images-labels-out b") and "picked.png" in text_of(browser, "#images-note")
        assert len(browser.find_elements("css selector", "#images-labels-out .bar-fill")) == 2
        assert not console_errors(browser), console_errors(browser)
    finally:
        browser.quit()


@pytest.mark.integration
def test_served_zero_shot_model_embeds_texts_and_images(served, image_models):
    """/v1/embeddings of a CLIP model: texts and images (data URLs) in one list, each vector the model's own features
    (normalised), in order; the image's and the texts' similarities rank the labels as the zero-shot answer does."""
    from hf2triton.pipeline.pipeline_answers import compare_embeddings, dual_encoder_embeddings

    image = probe_images()[1]
    url = "data:image/jpeg;base64," + base64.b64encode(image).decode()
    labels = ["red", "blue", "a green thing"]
    texts = [interface.DEFAULT_HYPOTHESIS_TEMPLATE.format(label) for label in labels]
    body = {
        "model": "clip",
        "input": [texts[0], {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": texts[1]}, texts[2]],
    }
    status, text = client.http_post(f"http://127.0.0.1:{served.config['openai']['port']}/v1/embeddings", body=body, timeout=60)
    assert status == 200, text
    answer = json.loads(text)
    vectors = np.array([d["embedding"] for d in answer["data"]], dtype=np.float32)
    reference_texts = dual_encoder_embeddings(str(image_models["clip"]), texts, True)
    reference_image = dual_encoder_embeddings(str(image_models["clip"]), [image], False)[interface.EMBEDDING]
    assert compare_embeddings({interface.EMBEDDING: vectors[[0, 2, 3]]}, reference_texts, 0.9999)["ok"]
    assert compare_embeddings({interface.EMBEDDING: vectors[[1]]}, {interface.EMBEDDING: reference_image}, 0.9999)["ok"]
    assert answer["usage"]["prompt_tokens"] == int(reference_texts[interface.PROMPT_TOKENS].sum())
    ranked = [labels[i] for i in np.argsort(-(vectors[[0, 2, 3]] @ vectors[1]))]
    zero_shot = json.loads(_infer_labels(served, "http", "clip", [image], {interface.CANDIDATE_LABELS: labels})[0])
    assert ranked == [item["label"] for item in zero_shot]
    for bad, message in (
        ({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}, "fetches no URLs"),
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}}, "is not an image"),
        ({"type": "audio"}, "must be a text or"),
    ):
        status, text = client.http_post(
            f"http://127.0.0.1:{served.config['openai']['port']}/v1/embeddings", body={"model": "clip", "input": [bad]}, timeout=60
        )
        assert status == 400 and message in json.loads(text)["error"]["message"], text
