"""The image and speech tasks' ONNX export (step `export_onnx`, called by export.py) and its parity gate.

optimum's exporter with the task its ORTModel classes load: image-classification (ViT, ConvNeXT, ...: logits),
zero-shot-image-classification (CLIP, SigLIP: one graph of both towers answering logits_per_image, image_embeds and
text_embeds), automatic-speech-recognition-with-past (Whisper: encoder_model.onnx + decoder_model_merged.onnx, one
decoder graph with and without its KV cache) or automatic-speech-recognition (a CTC model: model.onnx). float32 and
unfused (ONNX Runtime's transformer fusions are BERT-specific; a float16 cast would move the answers).

The gate, before the export is accepted: the serving engine on this export (ONNX Runtime, CPU) against the same engine
on torch, on validation's probes -- synthetic images (image_probes.py) or generated tones (audio_probes.py): labels
identical with scores within 1e-3 (and a dual encoder's embeddings at cosine >= 0.9999), transcripts identical.
The raw outputs' largest difference (logits, a dual encoder's logits_per_image, Whisper's encoder states, a CTC
model's logits) is reported beside them in export.json's `parity`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from hf2triton.errors import UserError
from hf2triton.serving import interface
from hf2triton.serving.interface import IMAGE_CLASSIFICATION, SPEECH_RECOGNITION, ZERO_SHOT_IMAGE_CLASSIFICATION

log = logging.getLogger(__name__)

MEDIA_OPTIMUM_TASKS = {
    IMAGE_CLASSIFICATION: "image-classification",
    ZERO_SHOT_IMAGE_CLASSIFICATION: "zero-shot-image-classification",
    SPEECH_RECOGNITION: "automatic-speech-recognition-with-past",  # Whisper; a CTC model: CTC_OPTIMUM_TASK
}
CTC_OPTIMUM_TASK = "automatic-speech-recognition"
SCORE_TOLERANCE = 1e-3  # the answers' scores, as the served answers are compared with the pipeline's
EMBEDDING_FLOOR = 0.9999  # a dual encoder's image / text embeddings, cosine
# Whisper's merged decoder answers both decoding steps; optimum also writes the two graphs it was merged from
UNMERGED_DECODERS = ("decoder_model.onnx", "decoder_with_past_model.onnx")


def optimum_task(task: str, pretrained: str) -> str:
    """optimum's export task for one of the image / speech tasks (a speech model's by its architectures)."""
    if task == SPEECH_RECOGNITION and interface.auto_class(task, pretrained) == interface.CTC_AUTO_CLASS:
        return CTC_OPTIMUM_TASK
    return MEDIA_OPTIMUM_TASKS[task]


def export_media(pretrained: str, task: str, opset: int, out: Path) -> dict[str, Any]:
    """optimum's export of `pretrained` into `out` (with its config and preprocessors), then the parity gate;
    returns the manifest's fields for it. UserError when optimum cannot export the model or the gate fails."""
    from optimum.exporters.onnx import main_export

    name = optimum_task(task, pretrained)
    log.info("exporting %s to ONNX with optimum (task %s, opset %d)", pretrained, name, opset)
    try:
        main_export(pretrained, output=out, task=name, opset=opset, device="cpu", do_validation=False, local_files_only=True)
    except (KeyError, ValueError) as err:  # optimum's "<model type> is not supported yet" and its kin
        raise UserError(
            f"backend onnx: optimum cannot export this {task} model ({str(err).splitlines()[0][:200]})",
            "use backend: python for it",
        ) from err
    if (out / "decoder_model_merged.onnx").is_file():
        for unmerged in UNMERGED_DECODERS:
            (out / unmerged).unlink(missing_ok=True)
    parity = parity_gate(pretrained, task, str(out))
    graphs = sorted(path.name for path in out.glob("*.onnx"))
    log.info("parity of the export vs torch: %s", parity)
    if not parity["ok"]:
        raise UserError(
            f"backend onnx: the ONNX export of {pretrained} does not answer as the torch model does ({parity})",
            "use backend: python for this model (the export is not kept)",
        )
    return {"optimum_task": name, "graphs": graphs, "parity": parity}


def parity_gate(model_dir: str, task: str, onnx_dir: str) -> dict[str, Any]:
    """The serving engine on the export vs on torch, on validation's probes: {"ok", figures...}."""
    from hf2triton.serving.tasks import engine_class

    engines = [engine_class(task)(model_dir, backend=backend, onnx_dir=onnx_dir) for backend in ("python", "onnx")]
    if task == SPEECH_RECOGNITION:
        return _speech_parity(*engines)
    return _image_parity(task, *engines)


def _max_diff(a: Any, b: Any) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


def _image_parity(task: str, torch_engine: Any, onnx_engine: Any) -> dict[str, Any]:
    from hf2triton.pipeline.image_probes import ZERO_SHOT_LABELS, probe_images
    from hf2triton.pipeline.pipeline_answers import compare_embeddings, compare_entities, entity_lists

    images = torch_engine.decode(np.array(probe_images(), dtype=np.object_))
    options = {interface.CANDIDATE_LABELS: ZERO_SHOT_LABELS} if task == ZERO_SHOT_IMAGE_CLASSIFICATION else {}
    answers = [entity_lists(engine.run(images, **options)[interface.LABELS]) for engine in (torch_engine, onnx_engine)]
    compared = compare_entities(*answers, ranked=True)
    pixels = torch_engine.pixels(images)
    with torch_engine.torch.inference_mode():
        if task == ZERO_SHOT_IMAGE_CLASSIFICATION:
            texts = torch_engine.texts(ZERO_SHOT_LABELS, interface.DEFAULT_HYPOTHESIS_TEMPLATE)
            raw = [engine.model(**texts, pixel_values=pixels).logits_per_image for engine in (torch_engine, onnx_engine)]
        else:
            raw = [engine.model(pixel_values=pixels).logits for engine in (torch_engine, onnx_engine)]
    result = {
        "probes": len(images),
        "labels_identical": not compared["texts_differing"],
        "max_score_diff": compared["max_score_diff"],
        "max_logit_diff": round(_max_diff(*raw), 7),
    }
    ok = compared["ok"] and compared["max_score_diff"] <= SCORE_TOLERANCE
    if task == ZERO_SHOT_IMAGE_CLASSIFICATION:  # the embeddings its other requests answer
        for kind, rows in (("images", images), ("texts", list(ZERO_SHOT_LABELS))):
            embedded = [engine.run(rows, embed=kind) for engine in (torch_engine, onnx_engine)]
            cosine = compare_embeddings(embedded[1], embedded[0], EMBEDDING_FLOOR)
            result[f"{kind}_embedding_cosine_min"] = cosine["cosine_min"]
            ok = ok and cosine["ok"]
    return {"ok": bool(ok), **result}


def _speech_parity(torch_engine: Any, onnx_engine: Any) -> dict[str, Any]:
    from hf2triton.pipeline.audio_probes import probe_audios

    audios = torch_engine.decode(np.array(probe_audios(), dtype=np.object_))
    texts = [engine.run(audios)[interface.TEXT_OUTPUT].tolist() for engine in (torch_engine, onnx_engine)]
    features = torch_engine.feature_extractor(audios[0], sampling_rate=torch_engine.rate, return_tensors="pt")
    with torch_engine.torch.inference_mode():
        if torch_engine.ctc:  # logits per frame
            raw = [engine.model(input_values=features["input_values"]).logits for engine in (torch_engine, onnx_engine)]
        else:  # the encoder's states, which every decoding step attends to
            encoders = [engine.model.get_encoder() for engine in (torch_engine, onnx_engine)]
            raw = [encoder(input_features=features["input_features"], attention_mask=None).last_hidden_state for encoder in encoders]
    same = sum(a == b for a, b in zip(*texts))
    result = {"probes": len(audios), "transcripts_identical": same, "max_output_diff": round(_max_diff(*raw), 7)}
    return {"ok": same == len(audios), **result}
