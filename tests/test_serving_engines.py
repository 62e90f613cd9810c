"""The serving code (rendered as model.py) tested in-process against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hf2triton.serving import interface
from hf2triton.serving.inputs import RequestError, decode_texts, generation_options
from hf2triton.serving.tasks.base import length_buckets
from hf2triton.serving.tasks.classification import ClassificationEngine
from hf2triton.serving.tasks.embedding import EmbeddingEngine
from hf2triton.serving.tasks.generation import GenerationEngine
from tests.helpers import minilm_dir

TEXTS = ["short", "a considerably longer sentence with many more tokens in it than the first", "naïve café — 東京"]


def test_decode_texts_accepts_utf8_and_refuses_bad_input():
    assert decode_texts(np.array([[b"caf\xc3\xa9"]], dtype=object), 100) == ["café"]
    for bad, message in [(b"\xff\xfe", "UTF-8"), (b"   ", "empty"), (b"x" * 101, "max_input_bytes"), (5, "BYTES")]:
        with pytest.raises(RequestError, match=message):
            decode_texts(np.array([[bad]], dtype=object), 100)


def test_texts_of_only_invisible_characters_are_empty():
    """NUL, zero-width space/joiners, BOM and soft hyphen (Unicode Cc/Cf) are no text: the tokenizer drops
    them, so such a text used to get the embedding of nothing instead of the error."""
    for invisible in ["\x00\x00", "\u200b\u200c\ufeff", " \u200d\t\x00\u00ad\u2060 ", "\u3000\u00a0"]:
        with pytest.raises(RequestError, match="text is empty"):
            decode_texts(np.array([[invisible.encode()]], dtype=object), 100)
    # visible text around them stays as sent
    for kept in ["a\x00", "\u200bword", "\ufeffcaf\u00e9", "\u0645\u200c\u0645"]:
        assert decode_texts(np.array([[kept.encode()]], dtype=object), 100) == [kept]


def test_generation_options_checked():
    defaults = {"max_new_tokens": 16, "temperature": 0.0}
    assert generation_options({}, defaults) == defaults
    assert generation_options({"max_new_tokens": np.array([[4]]), "temperature": np.array([[0.5]])}, defaults) == {
        "max_new_tokens": 4,
        "temperature": 0.5,
    }
    for raw, message in [
        ({"max_new_tokens": np.array([[-1]])}, "between 1"),
        ({"max_new_tokens": np.array([[1], [2]])}, "one value"),
        ({"temperature": np.array([[math.nan]])}, "finite"),
        ({"temperature": np.array([[-0.1]])}, "between 0"),
    ]:
        with pytest.raises(RequestError, match=message):
            generation_options(raw, defaults)


def test_an_unasked_answer_length_is_the_default_or_open_ended_cut_to_the_room():
    """No max_new_tokens: generation.max_new_tokens, or with OPEN_ENDED (the gateway's unset max_tokens) the per-request
    cap -- either cut to what the prompt leaves in the context (vLLM's rule)."""
    from hf2triton.serving.inputs import unasked_max_new_tokens

    assert unasked_max_new_tokens(None, 64, 1024, 4000) == 64
    assert unasked_max_new_tokens(np.array([[False]]), 64, 1024, 4000) == 64
    assert unasked_max_new_tokens(np.array([[True]]), 64, 1024, 4000) == 1024
    assert unasked_max_new_tokens(np.array([[True]]), 64, 1024, 300) == 300
    assert unasked_max_new_tokens(None, 64, 1024, 10) == 10
    with pytest.raises(RequestError, match="one value"):
        unasked_max_new_tokens(np.array([[True], [False]]), 64, 1024, 4000)


def test_temperature_between_zero_and_the_minimum_is_refused():
    """A float32 denormal (1e-45) divided the logits into inf/NaN: a 500 instead of a 400."""
    defaults = {"max_new_tokens": 16, "temperature": 0.0}
    for tiny in (1e-45, 1e-30, 0.005):
        with pytest.raises(RequestError, match=r"temperature=.* is not allowed: use 0 \(greedy\) or a finite number between 0\.01 and 100"):
            generation_options({"temperature": np.array([[tiny]], dtype=np.float32)}, defaults)
    for allowed in (0.0, 0.01, 1.0, 100.0):
        got = generation_options({"temperature": np.array([[allowed]], dtype=np.float32)}, defaults)["temperature"]
        assert got == pytest.approx(allowed)


def test_embeddings_match_independent_mean_pooling_and_ignore_padding(tiny_models):
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = tiny_models["feature-extraction"]
    engine = EmbeddingEngine(str(path), num_threads=1)
    batched = engine.run(TEXTS)["embedding"]
    assert batched.shape == (3, 32) and batched.dtype == np.float32
    assert np.allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    for text, row in zip(TEXTS, batched):
        with torch.no_grad():
            hidden = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0]
        expected = torch.nn.functional.normalize(hidden.mean(0), dim=0).numpy()
        assert float(np.dot(expected, row)) > 0.99999, text
        assert np.allclose(engine.run([text])["embedding"][0], row, atol=1e-5), "padding must not change a text's embedding"


@pytest.mark.parametrize("which", ["tiny", "minilm"])
def test_fast_tokenisation_equals_the_tokenizer_call(which, tiny_models):
    """encode() drives the Rust tokenizer directly; ids, masks and truncation must equal __call__'s."""
    path = tiny_models["feature-extraction"] if which == "tiny" else minilm_dir()
    engine = EmbeddingEngine(str(path), num_threads=1)
    assert engine.fast_tokenizer is not None
    texts = [*TEXTS, "word " * 1000, "  spaced   out\ttabs\n", "CAPS and ümlauts — ok?"]
    fast = engine.encode(texts)
    slow = engine.tokenizer(texts, padding=True, truncation=True, max_length=engine.max_length, return_tensors="pt")
    assert set(fast) == set(slow)
    for key in slow:
        assert fast[key].tolist() == slow[key].tolist(), key
    assert fast["input_ids"].shape[1] == engine.max_length, "truncated to the model's max_seq_length"


def test_length_buckets_cover_every_text_once_and_limit_padding():
    lengths = [5, 80, 7, 81, 6, 79, 40, 41] * 4
    buckets = length_buckets(lengths, min_size=4)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    assert all(max(lengths[i] for i in b) < 2 * min(lengths[i] for i in b) for b in buckets), "short and long texts end up apart"
    for bucket in buckets:
        real = sum(lengths[i] for i in bucket)
        assert max(lengths[i] for i in bucket) * len(bucket) <= 1.2 * real
    assert length_buckets([10] * 50, min_size=8) == [list(range(50))], "uniform lengths: one pass"
    assert length_buckets([1, 100], min_size=8) == [[0, 1]], "never below min_size"


def test_bucketed_batch_keeps_request_order(tiny_models):
    engine = EmbeddingEngine(str(tiny_models["feature-extraction"]), num_threads=1, min_bucket=2)
    texts = [("word " * n).strip() for n in (30, 2, 50, 3, 31, 1, 49, 4)]
    batched = engine.run(texts)["embedding"]
    assert len(list(engine.batches(texts))) > 1, "several buckets were used"
    for text, row in zip(texts, batched):
        assert np.allclose(engine.run([text])["embedding"][0], row, atol=1e-5), text
    wide = EmbeddingEngine(str(tiny_models["feature-extraction"]), num_threads=1, pad_multiple=8)
    assert wide.encode(texts)["input_ids"].shape[1] % 8 == 0
    assert np.allclose(wide.run(texts)["embedding"], batched, atol=1e-5), "padding to a multiple of 8 changes nothing"
    classes = ClassificationEngine(str(tiny_models["text-classification"]), num_threads=1, min_bucket=2)
    together = classes.run(texts)
    for i, text in enumerate(texts):
        alone = classes.run([text])
        assert alone["label"][0] == together["label"][i] and abs(alone["score"][0] - together["score"][i]) < 1e-5


def test_classification_labels_from_config(tiny_models):
    engine = ClassificationEngine(str(tiny_models["text-classification"]), num_threads=1)
    out = engine.run(TEXTS)
    assert {label.decode() for label in out["label"]} <= {"negative", "positive"}
    assert out["score"].shape == (3,) and np.all((out["score"] >= 0.5) & (out["score"] <= 1.0))


def test_generation_greedy_and_context_limit(tiny_models):
    engine = GenerationEngine(str(tiny_models["text-generation"]), num_threads=1)
    first = engine.run(["Hello there"], max_new_tokens=5)["text_output"]
    assert first.shape == (1,) and isinstance(first[0], bytes)
    assert engine.run(["Hello there"], max_new_tokens=5)["text_output"][0] == first[0], "greedy is deterministic"
    assert "<|im_start|>" in engine.prompt("hi"), "chat template applied"
    with pytest.raises(RequestError, match="exceeds the context"):
        engine.check_lengths(["word " * 400], 8)


def test_a_text_prompt_is_templated_as_configured_and_a_raw_one_as_it_is(tiny_models):
    """TEXT takes the chat template; RAW_PROMPT (the gateway's /v1/completions prompt) and an untemplated model's
    text are encoded as transformers' pipeline and vLLM encode a prompt: the tokenizer's special tokens (its BOS)."""
    from hf2triton.serving.inputs import prompt_ids

    engine = GenerationEngine(str(tiny_models["text-generation"]), num_threads=1)
    plain = engine.tokenizer("Hello there")["input_ids"]
    assert plain[0] == engine.tokenizer.bos_token_id and engine.text_ids("Hello there", raw=True) == plain
    assert engine.text_ids("Hello there") == engine.token_ids(engine.prompt("Hello there")) != plain
    text = np.array([b"Hello there"], dtype=np.object_)
    assert prompt_ids(engine, text, None, 1024, 4, raw=np.array([True])) == plain
    assert prompt_ids(engine, text, None, 1024, 4, raw=np.array([False])) == engine.text_ids("Hello there")
    with pytest.raises(RequestError, match="raw_prompt"):
        prompt_ids(engine, None, np.array([b'{"role": "user", "content": "hi"}'], dtype=np.object_), 1024, 4, raw=np.array([True]))
    untemplated = GenerationEngine(str(tiny_models["text-generation"]), num_threads=1, chat_template=False)
    assert untemplated.text_ids("Hello there") == plain


def test_generated_text_never_ends_in_a_partial_character(tiny_models):
    """Regression: max_new_tokens can cut a multi-byte character split over byte-level tokens; the text came
    back ending in U+FFFD ("你好，介绍一下你自己" -> emoji + "�")."""
    engine = GenerationEngine(str(tiny_models["text-generation"]))
    ids = engine.tokenizer.encode("Bonjour 😀", add_special_tokens=False)
    cut = next(n for n in range(len(ids) - 1, 0, -1) if engine.tokenizer.decode(ids[:n]).endswith("\ufffd"))
    assert engine.complete_text(ids[:cut]).rstrip() == "Bonjour" and "\ufffd" not in engine.complete_text(ids[:cut])
    assert engine.complete_text(ids) == "Bonjour 😀", "complete characters are kept"


def test_model_reads_its_parameters_through_the_interface():
    """One definition: model.py's tensor names and defaults are the interface's (model.py loads the same module)."""
    from hf2triton.serving import interface, model

    assert model.interface is interface and model.ModelParameters is interface.ModelParameters
    parsed = interface.ModelParameters.from_strings({"task": "text-generation", "model_dir": "/m", "chat_template": "false"})
    assert parsed.max_new_tokens == interface.DEFAULTS.max_new_tokens and parsed.chat_template is False
    assert interface.ModelParameters.from_strings(parsed.to_strings()) == parsed


def test_cuda_graph_buckets_pad_small_batches_and_leave_big_ones_eager():
    from hf2triton.serving.runtimes.graphs import graph_bucket

    assert graph_bucket(1, 9, 256) == (1, 16)
    assert graph_bucket(3, 40, 256) == (4, 64)
    assert graph_bucket(5, 200, 256) == (8, 256), "widths stop at the model's max_length"
    assert graph_bucket(32, 256, 256) == (32, 256)
    assert graph_bucket(64, 200, 256) is None, "more than GRAPH_MAX_TOKENS tokens: compute-bound, eager"
    assert graph_bucket(65, 8, 256) is None


def test_a_big_length_bucket_is_cut_into_graph_sized_chunks_in_order():
    from hf2triton.serving.runtimes.graphs import graph_bucket, graph_chunks

    lengths = [100, 20, 130, *range(30, 121)]
    bucket = sorted(range(len(lengths)), key=lengths.__getitem__)
    chunks = graph_chunks(bucket, lengths, 256)
    assert [i for chunk in chunks for i in chunk] == bucket, "every text once, in the bucket's order"
    assert all(graph_bucket(len(c), max(lengths[i] for i in c), 256) for c in chunks), "each chunk replays a graph"
    assert [len(c) for c in chunks] == [64, 30], "64 rows x 128 tokens fill a graph; then 32 x 256"
    assert graph_chunks([0, 1], [10, 20], 256) == [[0, 1]], "a bucket that fits stays whole"
    long = [10, 9000, 10000]
    assert graph_chunks([0, 1, 2], long, 32768) == [[0], [1, 2]], "texts too long for any graph: one eager pass"


def test_a_batch_fills_a_buckets_fixed_buffers_as_masked_padding():
    """What both graph kinds replay over: the batch top-left, padding ids and zero masks beside it, and rows
    beyond it attending to their first token only (a fully masked row would be NaN)."""
    import torch

    from hf2triton.serving.runtimes.graphs import fill_static, static_inputs

    names = ("input_ids", "attention_mask", "token_type_ids")
    inputs = static_inputs(torch, (4, 8), names, "cpu", pad_id=7)
    ones = torch.ones(3, 6, dtype=torch.int64)
    first = {"input_ids": torch.full((3, 6), 5), "attention_mask": ones, "token_type_ids": ones}
    fill_static(inputs, first, pad_id=7)
    second = {name: value[:1, :2] * 2 for name, value in first.items()}
    pointers = {name: buffer.data_ptr() for name, buffer in inputs.items()}
    fill_static(inputs, second, pad_id=7)  # a smaller batch leaves nothing of the last one behind
    assert {name: buffer.data_ptr() for name, buffer in inputs.items()} == pointers, "graphs read fixed addresses"
    assert inputs["input_ids"][0, :2].tolist() == [10, 10] and (inputs["input_ids"][0, 2:] == 7).all()
    assert (inputs["input_ids"][1:] == 7).all()
    assert inputs["attention_mask"].tolist() == [[2, 2, 0, 0, 0, 0, 0, 0]] + [[1, 0, 0, 0, 0, 0, 0, 0]] * 3
    assert inputs["token_type_ids"].sum().item() == 4


def _gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not _gpu_available(), reason="CUDA graphs need a CUDA GPU (run on the H200: benchmarks/h200/README.md)")
def test_cuda_graphs_answer_like_eager_and_like_float32_on_the_cpu():
    texts = [*TEXTS, *(f"sentence number {i} " * (i % 7 + 1) for i in range(29))]
    graphed = EmbeddingEngine(str(minilm_dir()), device="cuda:0", cuda_graphs=True)
    eager = EmbeddingEngine(str(minilm_dir()), device="cuda:0", cuda_graphs=False)
    reference = EmbeddingEngine(str(minilm_dir()), device="cpu", dtype="float32")
    texts += [f"a longer sentence of many words, number {i}, " * (i % 11 + 1) for i in range(300)]
    for size in (1, 3, 17, 32, 300):  # 300: graph-sized chunks of big length buckets (graph_chunks)
        got = graphed.run(texts[:size])[interface.EMBEDDING]
        for other in (eager, reference):
            want = other.run(texts[:size])[interface.EMBEDDING]
            assert (got * want).sum(axis=1).min() >= 0.999, size
    assert graphed.graphs.graphs and not graphed.graphs.failed, graphed.graphs.failed
    assert eager.graphs is None


def test_bucket_graphs_capture_once_per_bucket_replay_after_and_turn_off_on_a_failed_capture():
    """What CudaGraphs and OrtGraphs share, on the CPU with a stand-in capture: a bucket is captured once and
    replayed after, the batch's rows are cut from the fixed outputs, big batches and a failed capture run eagerly."""
    import torch

    from hf2triton.serving.runtimes.graphs import BucketGraphs, static_inputs

    class Doubling(BucketGraphs):
        captured: list = []

        def _capture(self, shape):
            if shape[1] > 32:
                raise RuntimeError("not capturable")
            self.captured.append(shape)
            inputs = static_inputs(torch, shape, self.names, "cpu", self.pad_id)
            outputs = {"ids": torch.zeros(shape, dtype=torch.int64)}
            return (lambda: outputs["ids"].copy_(inputs["input_ids"] * 2)), inputs, outputs

    graphs = Doubling(torch, "cpu", ("input_ids", "attention_mask"), max_length=256, pad_id=0)
    graphs.pool = "a pool"  # (torch's would need CUDA)
    batch = {"input_ids": torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]]), "attention_mask": torch.ones(3, 3, dtype=torch.int64)}
    first = graphs(batch)
    assert first["ids"].shape == (3, 16) and first["ids"][:, :3].tolist() == [[2, 4, 6], [8, 10, 12], [14, 16, 18]]
    assert graphs({k: v[:1] * 1 for k, v in batch.items()}) is not None and graphs(batch)["ids"][2, 0] == 14
    assert graphs.captured == [(4, 16), (1, 16)], "one capture per bucket, replays after"
    assert graphs({"input_ids": torch.ones(65, 4, dtype=torch.int64), "attention_mask": torch.ones(65, 4, dtype=torch.int64)}) is None
    wide = {"input_ids": torch.ones(1, 40, dtype=torch.int64), "attention_mask": torch.ones(1, 40, dtype=torch.int64)}
    assert graphs(wide) is None and "not capturable" in graphs.failed
    assert graphs(batch) is None, "a model that failed a capture runs eagerly from then on"


def test_token_id_prompts_and_an_echos_zero_new_tokens_are_checked():
    """Issue 44: prompt_ids are tokens of the model's vocabulary; max_new_tokens 0 only for a prompt's log-probabilities."""
    from hf2triton.serving.inputs import token_id_prompt

    assert token_id_prompt(np.array([3, 0, 9]), 10) == [3, 0, 9]
    for bad, words in ((np.array([], dtype=np.int64), "empty"), (np.array([3, 10]), "holds 10, not a token"), (np.array([-1]), "holds -1")):
        with pytest.raises(RequestError, match=words):
            token_id_prompt(bad, 10)
    defaults = {"max_new_tokens": 8, "temperature": 0.0}
    assert generation_options({"max_new_tokens": np.array([0])}, defaults, nothing_generated=True)["max_new_tokens"] == 0
    with pytest.raises(RequestError, match="max_new_tokens=0"):
        generation_options({"max_new_tokens": np.array([0])}, defaults)
