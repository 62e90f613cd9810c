"""text2text answers as transformers' pipeline(task) gives them: a checkpoint's generation_config.json settings
(n-gram blocking, minimum length, forced and banned tokens, repetition penalty) at every step of the streaming
batcher -- token for token generate(num_beams=1)'s --, its beam search for whole answers (the pipeline's), T5's
task_specific_params (prefix and settings) under an alias task; served: the whole answers equal pipeline(task),
the streamed ones the one-beam answer (validation's checks), the server log names the settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf2triton.serving import interface
from hf2triton.serving.batching.settings import StepSettings
from hf2triton.serving.tasks.text2text import CheckpointGeneration, Text2TextEngine
from hf2triton.triton import client
from tests.helpers import make_workflow, passed_checks, t5_tokenizer, tiny_bart, tiny_t5
from tests.test_text2text import PROMPTS, drain, new_batcher, submit

COUNTS = [14, 9, 20, 11]


def with_settings(directory: Path, generation: dict, task_params: dict | None = None) -> Path:
    """A saved model whose generation_config.json (and config.json's task_specific_params) set `generation`."""
    path = directory / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **generation}))
    if task_params is not None:
        config = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**config, "task_specific_params": task_params}))
    return directory


def bart_with_settings(directory: Path) -> Path:
    """Tiny BART asking for beams, bigram blocking, a minimum length, a forced first and last token, banned words
    (one token and a pair) and a repetition penalty."""
    tiny_bart(directory)
    settings = {"no_repeat_ngram_size": 2, "min_length": 9, "forced_bos_token_id": 5, "bad_words_ids": [[7], [9, 10]]}
    return with_settings(directory, {**settings, "repetition_penalty": 1.2, "forced_eos_token_id": 1, "num_beams": 3})


def t5_summarizer(directory: Path) -> Path:
    """Tiny T5 whose task_specific_params name a summarization prefix and settings (as t5-small's do)."""
    tiny_t5(directory)
    summarize = {
        "prefix": "summarize: ",
        "no_repeat_ngram_size": 2,
        "min_length": 6,
        "num_beams": 2,
        "length_penalty": 2.0,
        "max_length": 30,
    }
    return with_settings(directory, {}, {"summarization": summarize})


def tiny_marian(directory: Path) -> Path:
    """A random 2-layer MarianMTModel (sinusoidal positions, decoding from pad) with opus-mt's generation settings:
    beams, max_length 512, the pad token banned (bad_words_ids)."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    tokenizer = t5_tokenizer(directory)
    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=len(tokenizer), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=256,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, forced_eos_token_id=None,
    )  # fmt: skip
    MarianMTModel(config).eval().save_pretrained(directory)
    return with_settings(directory, {"num_beams": 6, "max_length": 512, "bad_words_ids": [[0]], "no_repeat_ngram_size": 2})


def test_marian_batcher_and_whole_answers(tmp_path):
    from transformers import pipeline

    marian = Text2TextEngine(str(tiny_marian(tmp_path / "marian")), pipeline_task="translation")
    batcher = new_batcher(marian, max_sequences=2)
    collectors = [submit(batcher, marian, p, max_new_tokens=n) for p, n in zip(PROMPTS, COUNTS)]
    drain(batcher)
    for prompt, count, collector in zip(PROMPTS, COUNTS, collectors):
        assert collector.text == marian.tokenizer.decode(one_beam(marian, prompt, count), skip_special_tokens=True), prompt
    translator = pipeline("translation", model=str(tmp_path / "marian"))
    answer = marian.run([PROMPTS[0]], max_new_tokens=10)[interface.TEXT_OUTPUT][0].decode()
    assert answer == translator(PROMPTS[0], max_new_tokens=10)[0]["translation_text"].strip()
    assert marian.beams == 4 and marian.checkpoint_max_new_tokens() == 511  # the pipeline's 4 beams win over the file's 6


@pytest.fixture(scope="module")
def bart(tmp_path_factory) -> Text2TextEngine:
    return Text2TextEngine(str(bart_with_settings(tmp_path_factory.mktemp("bart"))))


def one_beam(engine: Text2TextEngine, prompt: str, count: int) -> list[int]:
    """generate(num_beams=1) with the checkpoint's settings, up to (without) the end token."""
    ids = engine.model.generate(**engine.tokenizer([prompt], return_tensors="pt"), num_beams=1, max_new_tokens=count)[0, 1:].tolist()
    return ids[: ids.index(1)] if 1 in ids else ids


def test_batcher_applies_the_checkpoint_settings_as_generate_with_one_beam(bart):
    assert bart.step_settings is not None and bart.beams == 4  # the pipeline's default beams win over the file's 3
    batcher = new_batcher(bart, max_sequences=3)
    collectors = [submit(batcher, bart, p, max_new_tokens=n) for p, n in zip(PROMPTS[:2], COUNTS)]
    for _ in range(3):
        batcher.step()  # the others join mid-way
    collectors += [submit(batcher, bart, p, max_new_tokens=n) for p, n in zip(PROMPTS[2:], COUNTS[2:])]
    drain(batcher)
    plain = new_batcher(bart, max_sequences=3, settings=None)
    unset = submit(plain, bart, PROMPTS[0], max_new_tokens=COUNTS[0])
    drain(plain)
    for prompt, count, collector in zip(PROMPTS, COUNTS, collectors):
        expected = one_beam(bart, prompt, count)
        assert collector.finish.completion_tokens == len(expected) and expected[0] == 5
        assert collector.text == bart.tokenizer.decode(expected, skip_special_tokens=True), prompt
        pairs = list(zip(expected, expected[1:]))
        assert len(pairs) == len(set(pairs)) and 7 not in expected  # no bigram twice, the banned token never
        assert collector.finish.reason == "stop" and len(expected) == count - 1  # forced_eos_token_id at the last place
    assert unset.text != collectors[0].text, "the settings change the answer"


def test_whole_answers_equal_the_pipeline(bart, tmp_path):
    from transformers import pipeline

    reference = pipeline("summarization", model=bart.model, tokenizer=bart.tokenizer)
    for prompt in PROMPTS[:2]:
        served = bart.run([prompt], max_new_tokens=12)[interface.TEXT_OUTPUT][0].decode()
        assert served == reference(prompt, max_new_tokens=12)[0]["summary_text"].strip()
    t5 = Text2TextEngine(str(t5_summarizer(tmp_path / "t5")), pipeline_task="summarization")
    assert (t5.prompt("a text"), t5.beams, t5.step_settings.min_length) == ("summarize: a text", 2, 6)
    assert t5.checkpoint_max_new_tokens() == 29  # a request's default: max_length less the start token
    summarizer = pipeline("summarization", model=str(tmp_path / "t5"))
    answer = t5.run([PROMPTS[3]], max_new_tokens=12)[interface.TEXT_OUTPUT][0].decode()
    assert answer == summarizer(PROMPTS[3], max_new_tokens=12)[0]["summary_text"].strip()
    assert "summarize: " not in Text2TextEngine(str(tmp_path / "t5")).prompt("x"), "only under the alias task"
    # preflight's line, from the saved files alone, names what the loaded engine follows
    assert CheckpointGeneration.from_files(str(tmp_path / "t5"), "summarization", True).describe() == t5.describe_settings()


def test_settings_off_or_unset_cost_nothing(bart, tmp_path):
    from transformers import GenerationConfig

    assert StepSettings.read(GenerationConfig(repetition_penalty=1.0, min_length=0), {1}) is None
    off = Text2TextEngine(bart.model.name_or_path, checkpoint_defaults=False)
    assert off.step_settings is None and off.beams == 1 and not off.answers_whole(0.0)
    assert "off (generation.checkpoint_defaults: false)" in off.describe_settings()
    line = bart.describe_settings()
    assert line.startswith("t2t: checkpoint generation settings: num_beams 4 (whole answers") and "no_repeat_ngram_size 2" in line


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The BART with settings (streaming, summarization) and the T5 summarizer (static), served with validation."""
    models = tmp_path_factory.mktemp("t2t-settings-models")
    entries = [
        {"name": "bart", "source": str(bart_with_settings(models / "bart")), "task": "summarization"},
        {"name": "t5", "source": str(t5_summarizer(models / "t5")), "task": "summarization", "generation": {"streaming": False}},
    ]
    workflow = make_workflow(tmp_path_factory.mktemp("t2t-settings-workflow"), entries)
    workflow.run("serve")
    yield workflow
    workflow.stop()


@pytest.mark.integration
def test_served_answers_equal_the_pipeline_and_streams_the_one_beam_answer(served):
    checks = passed_checks(served, "bart", {"stream equals generate", "served equals pipeline(summarization)", "served equals in-process"})
    assert "whole answers search 4 beams" in checks["stream equals generate"]["detail"]
    passed_checks(served, "t5", {"served equals pipeline(summarization)", "served equals in-process"})
    url = served.settings().url("grpc_port")
    whole = client.http_generate(
        served.settings().url(), "bart", {interface.TEXT: PROMPTS[0], interface.MAX_NEW_TOKENS: 12, interface.STREAM: False}
    )
    streamed = client.stream_generate(url, "bart", PROMPTS[0], {interface.MAX_NEW_TOKENS: 12})
    assert whole[0] == 200 and whole[1][interface.TEXT_OUTPUT] != streamed["text"], "beams whole, one beam streamed"
    preflight = json.loads((served.directory / "results" / "preflight.json").read_text())
    assert any(c["name"] == "t2t:bart" and c["detail"].startswith("t2t: checkpoint generation settings") for c in preflight["checks"])
    log = (served.directory / ".hf2triton" / "server" / "tritonserver.log").read_text()
    assert log.count("t2t: checkpoint generation settings: num_beams 4 (whole answers") == 1
    assert "t2t: checkpoint generation settings: prefix 'summarize: ', num_beams 2" in log
