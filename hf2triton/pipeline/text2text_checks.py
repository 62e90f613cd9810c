"""text2text-generation's validation beyond the served-vs-in-process comparison: the served whole answer equals
transformers' pipeline(task) (the alias the config names, else text2text-generation: the same prefix, the same
generation config, beams included), and a streamed answer -- beams do not stream -- equals the in-process greedy
one-beam answer with the checkpoint's per-step settings (the tokens the streaming batcher gives)."""

from __future__ import annotations

from hf2triton.pipeline import references
from hf2triton.pipeline.pipeline_answers import pipeline_text2text
from hf2triton.serving import interface
from hf2triton.serving.interface import ModelParameters


def pipeline_check(params: ModelParameters, device: str, texts: list[str], served: list[str], max_new_tokens: int) -> tuple[str, bool, str]:
    """(name, ok, detail): the served whole answers vs pipeline(task)'s, both stripped as served."""
    task = params.pipeline_task or interface.TEXT2TEXT
    name = f"served equals pipeline({task})"
    if not params.checkpoint_defaults:
        return name, True, "not compared: generation.checkpoint_defaults false (plain decoding, not the pipeline's config)"
    answers = references.remembered_call(
        pipeline_text2text, device, task=task, model_dir=params.model_dir, texts=texts, dtype=params.dtype, max_new_tokens=max_new_tokens
    )
    answers = [a.strip() for a in answers]
    served = [s.strip() for s in served]
    return name, served == answers, f"served {served!r} vs pipeline {answers!r}"


def one_beam_answer(params: ModelParameters, device: str, prompt: str, max_new_tokens: int) -> tuple[str, int]:
    """The in-process greedy one-beam answer with the checkpoint's per-step settings, and the engine's beams
    (1: whole answers are one beam too)."""
    from hf2triton.serving.tasks import engine_from_parameters

    engine = engine_from_parameters(params, device)
    ids = engine.generate_ids([engine.text_ids(prompt)], max_new_tokens, beams=False)[0]
    ended = next((at for at, token in enumerate(ids) if token in engine.stop_ids), len(ids))
    return engine.complete_text(ids[:ended]), engine.beams


def stream_check(
    params: ModelParameters, device: str, prompt: str, streamed: str, whole: str | None, max_new_tokens: int
) -> tuple[str, bool, str]:
    """(name, ok, detail): the streamed answer vs the one-beam answer in-process; where whole answers are one beam,
    also vs the served whole answer."""
    reference, beams = references.remembered_call(one_beam_answer, device, params=params, prompt=prompt, max_new_tokens=max_new_tokens)
    ok = streamed.strip() == reference.strip() and (beams > 1 or streamed == whole)
    how = f"whole answers search {beams} beams, streamed ones decode greedily" if beams > 1 else f"the whole answer {whole!r}"
    return "stream equals generate", ok, f"streamed {streamed!r} vs one-beam greedy in-process {reference!r} ({how})"
