"""backend onnx for the image and speech tasks (issue 45): optimum's export (image-classification, CLIP / SigLIP's
zero-shot graph of both towers, Whisper's encoder + merged decoder, a CTC model's graph), its parity gate against the
torch engine on synthetic images / tones, ONNX Runtime serving through the same engines (image processor and pipeline
post-processing; Whisper through transformers' ASR pipeline over optimum's ORTModelForSpeechSeq2Seq), the config's
acceptance and refusals; and one real serve of ViT + CLIP + Whisper with backend onnx: validation PASS (served = the
torch pipeline, parity onnx vs torch), the export's parity report, answers over HTTP equal to the pipeline's."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from hf2triton.serving import interface
from tests.helpers import make_workflow, passed_checks
from tests.media_models import build_image_models, build_tiny_ctc, build_tiny_whisper, text_tokenizer

IC, ZS, ASR = interface.IMAGE_CLASSIFICATION, interface.ZERO_SHOT_IMAGE_CLASSIFICATION, interface.SPEECH_RECOGNITION
MODEL = {"name": "m", "source": "org/model"}


@pytest.fixture(scope="module")
def media_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("media-models")
    return {**build_image_models(root / "images"), "whisper": build_tiny_whisper(root / "whisper")}


def test_export_task_mapping(tmp_path):
    from optimum.exporters.onnx import model_configs  # noqa: F401 - registers optimum's ONNX configs
    from optimum.exporters.tasks import TasksManager

    from hf2triton.pipeline.export import OPTIMUM_TASKS
    from hf2triton.pipeline.media_export import optimum_task

    for task, architecture, expected in (
        (IC, "ViTForImageClassification", "image-classification"),
        (ZS, "CLIPModel", "zero-shot-image-classification"),
        (ASR, "WhisperForConditionalGeneration", "automatic-speech-recognition-with-past"),
        (ASR, "Wav2Vec2ForCTC", "automatic-speech-recognition"),
    ):
        (tmp_path / "config.json").write_text(json.dumps({"architectures": [architecture]}))
        assert optimum_task(task, str(tmp_path)) == expected
    exported_as = ["image-classification", "zero-shot-image-classification", "automatic-speech-recognition-with-past"]
    assert [OPTIMUM_TASKS[t] for t in (IC, ZS, ASR)] == exported_as
    for model_type, task in (("vit", IC), ("convnext", IC), ("clip", ZS), ("siglip", ZS), ("whisper", ASR), ("wav2vec2", ASR)):
        supported = TasksManager.get_supported_tasks_for_model_type(model_type, exporter="onnx", library_name="transformers")
        assert OPTIMUM_TASKS[task].replace("-with-past", "") in supported, (model_type, list(supported))


def test_config_takes_onnx_for_images_and_speech_and_refuses_tensorrt_and_int8():
    from hf2triton.config import validate_config
    from hf2triton.errors import UserError
    from hf2triton.pipeline.preflight import serving_dtype
    from hf2triton.specs import Footprint, onnx_precision

    def config(**changes) -> dict:
        return {"models": [{**copy.deepcopy(MODEL), **changes}]}

    for task in (IC, ZS, ASR):
        model = validate_config(config(task=task, backend="onnx"))["models"][0]
        assert model["backend"] == "onnx" and model["onnx"]["quantize"] == "none"
        assert onnx_precision("onnx", "KIND_GPU", "auto", task) == "float32"  # optimum's float32 graph on the GPU too
        footprint = Footprint(name="m", source="org/model", task=task, device="gpu", dtype="auto", instances=1, backend="onnx")
        assert serving_dtype(footprint, gpu=True) == "float32"  # preflight sizes the GPU's weights as the export's
        with pytest.raises(UserError) as refused:
            validate_config(config(task=task, backend="tensorrt"))
        assert f"backend = 'tensorrt': not built for {task}" in refused.value.message
        assert refused.value.fix == "use backend: onnx (or python) for it"
        with pytest.raises(UserError) as refused:
            validate_config(config(task=task, backend="onnx", onnx={"quantize": "dynamic-int8"}))
        assert "onnx.quantize = 'dynamic-int8'" in refused.value.message and f"{task} is exported in float32" in refused.value.message
        assert refused.value.fix == "use quantize: none"
        with pytest.raises(UserError) as refused:
            validate_config(config(task=task, backend="vllm"))
        assert refused.value.fix == "use backend: python or onnx for it"
    with pytest.raises(UserError, match="not yet for text2text-generation"):
        validate_config(config(task=interface.TEXT2TEXT, backend="onnx"))


def test_siglip_and_ctc_exports_pass_the_gate_and_answer_as_the_pipeline(media_models, tmp_path):
    """SigLIP (its graph takes no attention mask, as its tokenizer sends none) and a CTC model (wav2vec2) in-process."""
    from hf2triton.pipeline.export import export_onnx_step
    from hf2triton.pipeline.image_probes import ZERO_SHOT_LABELS, probe_images
    from hf2triton.pipeline.pipeline_answers import compare_entities, entity_lists, pipeline_image_answers
    from hf2triton.serving.tasks.vision import ZeroShotImageEngine

    siglip = str(tmp_path / "siglip-model")  # with a tokenizer that sends no attention mask, as SigLIP's own
    shutil.copytree(media_models["siglip"], siglip)
    text_tokenizer(["input_ids"]).save_pretrained(siglip)
    manifest = export_onnx_step(siglip, ZS, 17, "auto", "O2", "none", str(tmp_path / "siglip"))
    assert manifest["parity"]["ok"] and manifest["parity"]["labels_identical"], manifest["parity"]
    engine = ZeroShotImageEngine(siglip, backend="onnx", onnx_dir=str(tmp_path / "siglip"))
    served = entity_lists(engine.run(probe_images(), candidate_labels=ZERO_SHOT_LABELS)[interface.LABELS])
    assert compare_entities(served, entity_lists(pipeline_image_answers(ZS, siglip, probe_images())[interface.LABELS]))["ok"]
    ctc = build_tiny_ctc(tmp_path / "wav2vec2")
    manifest = export_onnx_step(str(ctc), ASR, 17, "auto", "O2", "none", str(tmp_path / "ctc"))
    assert manifest["optimum_task"] == "automatic-speech-recognition" and manifest["graphs"] == ["model.onnx"]
    assert manifest["parity"]["ok"] and manifest["parity"]["transcripts_identical"] == 2, manifest["parity"]


def test_an_export_that_answers_otherwise_fails_the_gate_and_is_not_kept(media_models, tmp_path):
    """The tiny SigLIP as built for the torch tests, whose BERT tokenizer sends an attention mask: torch masks the
    padding, optimum's SigLIP graph takes no mask (SigLIP's own tokenizer sends none) -- the answers differ, so the
    export is refused with the figures and the fix, and nothing is left."""
    from hf2triton.errors import UserError
    from hf2triton.pipeline.export import export_onnx_step

    with pytest.raises(UserError) as refused:
        export_onnx_step(str(media_models["siglip"]), ZS, 17, "auto", "O2", "none", str(tmp_path / "siglip"))
    assert "does not answer as the torch model does" in refused.value.message and "'labels_identical': False" in refused.value.message
    assert refused.value.fix.startswith("use backend: python") and not (tmp_path / "siglip").exists()


# ---------------------------------------------------------------- one real serve


@pytest.fixture(scope="module")
def served(tmp_path_factory, media_models):
    """ViT, CLIP and Whisper with backend onnx (max_batch_size 4: Triton's dynamic batcher groups images)."""
    entry = {"backend": "onnx", "max_batch_size": 4}
    models = [{"name": name, "source": str(media_models[name]), **entry} for name in ("vit", "clip", "whisper")]  # tasks inferred
    workflow = make_workflow(tmp_path_factory.mktemp("onnx-media-workflow"), models)
    workflow.run("serve")
    yield workflow
    workflow.stop()


@pytest.mark.integration
def test_served_onnx_image_and_speech_models_validate_against_torch(served, media_models):
    import tritonclient.http as httpclient

    from hf2triton.pipeline.image_probes import encoded, probe_images, synthetic_image
    from hf2triton.pipeline.pipeline_answers import compare_entities, entity_lists, pipeline_image_answers
    from hf2triton.triton import client

    graphs = {"vit": ["model.onnx"], "clip": ["model.onnx"], "whisper": ["decoder_model_merged.onnx", "encoder_model.onnx"]}
    for name in ("vit", "clip", "whisper"):
        required = {"served equals in-process", "parity onnx vs torch", "onnx provider"}
        required |= {"embeddings equal in-process"} if name == "clip" else set()
        checks = passed_checks(served, name, required)
        assert "CPUExecutionProvider, float32 graph" in checks["onnx provider"]["detail"]
        parity = served.report()["models"][name]["parity"]
        assert parity["ok"] and (parity.get("greedy_identical") == 2 if name == "whisper" else parity["max_score_diff"] < 1e-3), parity
        export = json.loads((served.work / f"models/{name}/onnx/export.json").read_text())  # the export's own gate
        assert export["graphs"] == graphs[name] and export["precision"] == "float32" and export["parity"]["ok"], export
        assert export["parity"]["probes"] == (2 if name == "whisper" else 3)
        print(name, "validation parity:", parity, "export parity:", export["parity"])
    assert {served.report()["models"][name]["backend"] for name in graphs} == {"onnx"}
    images = [*probe_images(), encoded(synthetic_image(40, 24, 3), "JPEG")]  # 4 images in one request: one ONNX Runtime run
    triton = client.http_client(served.settings().url("http_port"))
    try:
        answer = triton.infer("vit", client.build_inputs(httpclient, images, {interface.TOP_K: 2}, primary=interface.IMAGE))
        served_labels = entity_lists(answer.as_numpy(interface.LABELS).reshape(-1))
        from tritonclient.utils import InferenceServerException

        from hf2triton.pipeline.audio_probes import probe_audios

        with pytest.raises(InferenceServerException, match="'word_timestamps': not served by this model.*ONNX Runtime"):
            words = {interface.WORD_TIMESTAMPS: True}  # optimum's decoder returns no cross-attentions to time words by
            triton.infer("whisper", client.build_inputs(httpclient, probe_audios()[:1], words, primary=interface.AUDIO))
    finally:
        triton.close()
    reference = entity_lists(pipeline_image_answers(IC, str(media_models["vit"]), images, top_k=2)[interface.LABELS])
    assert compare_entities(served_labels, reference)["ok"] and all(len(row) == 2 for row in served_labels)
    assert np.isfinite([item["score"] for row in served_labels for item in row]).all()
