"""Validation's extra check of a zero-shot image model (CLIP, SigLIP): its embedding requests -- images with `embed`
true, texts instead of images -- equal the model's features computed in-process, each row alone
(pipeline_answers.dual_encoder_embeddings): cosine >= the floor, the same token counts."""

from __future__ import annotations

from typing import Any

from hf2triton.pipeline import references
from hf2triton.pipeline.image_probes import ZERO_SHOT_LABELS, probe_images
from hf2triton.pipeline.pipeline_answers import compare_embeddings, dual_encoder_embeddings
from hf2triton.serving import interface
from hf2triton.triton import client


def embeddings_check(http_client, name: str, model_dir: str, device: str, dtype: str, floor: float) -> dict[str, Any]:
    """{"name", "ok", "detail"}: the served image and text embeddings against the in-process reference."""
    import tritonclient.http as httpclient

    details, ok = [], True
    for texts, rows in ((False, probe_images()), (True, list(ZERO_SHOT_LABELS))):
        primary = interface.TEXT if texts else interface.IMAGE
        options = None if texts else {interface.EMBED: True}
        result = http_client.infer(name, client.build_inputs(httpclient, rows, options, primary=primary))
        served = {key: result.as_numpy(key) for key in (interface.EMBEDDING, interface.PROMPT_TOKENS)}
        served[interface.EMBEDDING] = served[interface.EMBEDDING].reshape(len(rows), -1)
        reference = references.remembered_call(dual_encoder_embeddings, device, model_dir=model_dir, rows=rows, texts=texts, dtype=dtype)
        compared = compare_embeddings(served, reference, floor)
        same_tokens = served[interface.PROMPT_TOKENS].reshape(-1).tolist() == reference[interface.PROMPT_TOKENS].tolist()
        ok = ok and compared["ok"] and same_tokens
        what = "texts" if texts else "images"
        width = served[interface.EMBEDDING].shape[1]
        details.append(f"{len(rows)} {what}: min cosine {compared['cosine_min']:.6f}, {width} dims, same tokens {same_tokens}")
    return {"name": "embeddings equal in-process", "ok": ok, "detail": "; ".join(details) + f" (floor {floor})"}
