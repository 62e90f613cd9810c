"""The ONNX Runtime decoder behind the continuous batcher, in-process (no Triton): both exporters' graphs (the
GenAI builder's right-padded GroupQueryAttention, also on the preallocated cache a GPU uses, and optimum's
left-padded one) give the torch batcher's tokens for rows that join and leave at any step and a long prompt
prefilled in chunks; a cancelled row leaves within one step; log-probabilities, grammars and stop strings come
from the same logits path."""

from __future__ import annotations

import pytest

from hf2triton.serving.batching.continuous import ContinuousBatcher
from hf2triton.serving.batching.onnx import OnnxBatcher, OnnxSlotBatcher, new_batcher
from hf2triton.serving.batching.sequences import Guided, Sampling, Sequence

PROMPTS = ["What is the capital of France?", "Hi", "Tell me a very long story about a dragon and a knight", "x y z"]
LONG_PROMPT = " ".join(f"chapter {i}: the dragon met the knight again." for i in range(10))  # 110 tokens: chunked below
LIMITS = {"max_sequences": 3, "max_queue": 16, "context": 256, "max_prefill_tokens": 64}
# (exporter, preallocated cache): the served choices -- the builder's graph on the CPU and on a GPU (eager, or in
# the padded buckets and fixed buffers its CUDA graphs replay: ONNX Runtime's CPU provider runs them as they are),
# optimum's
VARIANTS = [("genai-builder", False), ("genai-builder", True), ("genai-builder", "buckets"), ("optimum", False)]
VARIANT_IDS = ["builder-dynamic", "builder-slots", "builder-slots-graph-buckets", "optimum"]


@pytest.fixture(scope="module")
def exports(tmp_path_factory, tiny_models) -> dict:
    """The tiny decoder on torch, and its export by each exporter, run by ONNX Runtime."""
    import transformers

    from hf2triton.pipeline.export import export_onnx_step
    from hf2triton.serving.runtimes.onnxruntime import OrtDecoder

    path = tiny_models["text-generation"]
    root = tmp_path_factory.mktemp("onnx-batcher")
    decoders = {}
    for exporter in ("genai-builder", "optimum"):
        export_onnx_step(str(path), "text-generation", 17, exporter, "O2", "none", str(root / exporter))
        decoders[exporter] = OrtDecoder(str(root / exporter), 1)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    return {"torch": transformers.AutoModelForCausalLM.from_pretrained(path).eval(), "tokenizer": tokenizer, **decoders}


def served(exports, exporter: str, slots: bool | str) -> OnnxBatcher:
    """The batcher model.py would build (`slots`: as on a GPU, after its probe against the dynamic cache;
    "buckets": as with CUDA graphs, whose capture needs a GPU)."""
    if slots == "buckets":
        batcher = OnnxSlotBatcher(exports[exporter], exports["tokenizer"], "cpu", graphs=True, **LIMITS)
        return batcher
    batcher = new_batcher(exports[exporter], exports["tokenizer"], "cpu", cuda_graphs=False, slots=slots, **LIMITS)
    assert isinstance(batcher, OnnxSlotBatcher) == slots and batcher.right_padded == (exporter == "genai-builder")
    return batcher


def run(batcher, tokenizer, requests: list[tuple[str, Sampling]], every: int = 2) -> list[Sequence]:
    """The requests submitted one every `every` steps (each joins a running batch; they leave as they end)."""
    sequences = [Sequence(tokenizer(p, add_special_tokens=False)["input_ids"], s, lambda text, finish: None) for p, s in requests]
    pending = list(sequences)
    while pending or not batcher.idle:
        if pending and batcher.steps % every == 0:
            batcher.submit(pending.pop(0))
        batcher.step()
    return sequences


@pytest.mark.parametrize("exporter,slots", VARIANTS, ids=VARIANT_IDS)
def test_rows_joining_and_leaving_decode_the_torch_batchers_tokens(exports, exporter, slots):
    tokenizer = exports["tokenizer"]
    requests = [(p, Sampling(max_new_tokens=n)) for p, n in zip([*PROMPTS, LONG_PROMPT], (20, 5, 30, 12, 24))]
    want = run(ContinuousBatcher(exports["torch"], tokenizer, "cpu", **LIMITS), tokenizer, requests)
    batcher = served(exports, exporter, slots)
    got = run(batcher, tokenizer, requests)
    assert [s.generated for s in got] == [s.generated for s in want]
    assert [s.text for s in got] == [s.text for s in want]
    assert batcher.cache is None and batcher.running == []  # all rows left: nothing held
    if slots == "buckets":  # padded rows and columns, a binding per bucket (the long prompt grows past 128 columns)
        shapes = {shape[:2] for shape in batcher.graph_steps}
        assert shapes >= {(2, 128), (3, 128)} and 256 in {columns for _, columns in shapes}


@pytest.mark.parametrize("exporter,slots", VARIANTS, ids=VARIANT_IDS)
def test_a_cancelled_row_leaves_within_a_step_and_the_others_go_on(exports, exporter, slots):
    tokenizer = exports["tokenizer"]
    batcher = served(exports, exporter, slots)
    gone = {"flag": False}
    finishes: dict[int, str] = {}
    sequences = [
        Sequence(
            tokenizer(p, add_special_tokens=False)["input_ids"],
            Sampling(max_new_tokens=40),
            lambda text, finish, i=i: finishes.update({i: finish.reason}) if finish else None,
            cancelled=(lambda: gone["flag"]) if i == 0 else (lambda: False),
        )
        for i, p in enumerate(PROMPTS[:2])
    ]
    for sequence in sequences:
        batcher.submit(sequence)
    for _ in range(4):
        batcher.step()
    assert len(batcher.running) == 2
    gone["flag"] = True
    batcher.step()
    assert finishes == {0: "cancelled"} and batcher.running == [sequences[1]]
    cached = len(sequences[1].prompt_ids) + len(sequences[1].generated) - 1  # the last token is the next step's input
    if slots:  # the row moved into the freed first slot
        assert batcher.lengths == [cached] and int(batcher.positions[0]) == cached
    else:  # the columns only the cancelled row used are trimmed
        assert batcher.mask.shape[1] == batcher.cache[0][0].shape[2] == cached
    while not batcher.idle:
        batcher.step()
    alone = run(ContinuousBatcher(exports["torch"], tokenizer, "cpu", **LIMITS), tokenizer, [(PROMPTS[1], Sampling(max_new_tokens=40))])
    assert sequences[1].generated == alone[0].generated


def test_logprobs_grammars_and_stop_strings_come_from_the_same_logits(exports):
    """What the base batcher's logits path gives: the chosen and prompt tokens' log-probabilities (the torch
    model's, to float precision), a JSON grammar, a stop string -- in one mixed batch on the builder's graph."""
    tokenizer = exports["tokenizer"]
    plain = run(ContinuousBatcher(exports["torch"], tokenizer, "cpu", **LIMITS), tokenizer, [(PROMPTS[0], Sampling(max_new_tokens=20))])
    stop = plain[0].text[4:7]
    requests = [
        (PROMPTS[0], Sampling(max_new_tokens=8, logprobs=2, prompt_logprobs=True)),
        (PROMPTS[2], Sampling(max_new_tokens=24, guided=Guided("json_object"))),
        (PROMPTS[0], Sampling(max_new_tokens=20, stop=(stop,))),
    ]
    want = run(ContinuousBatcher(exports["torch"], tokenizer, "cpu", **LIMITS), tokenizer, requests)
    got = run(OnnxBatcher(exports["genai-builder"], tokenizer, "cpu", **LIMITS), tokenizer, requests)
    assert [s.generated for s in got] == [s.generated for s in want]
    assert got[2].text == plain[0].text[: plain[0].text.index(stop)]
    for mine, theirs in ((got[0].logprobs, want[0].logprobs), (got[0].prompt_logprobs, want[0].prompt_logprobs)):
        assert [item.id for item in mine] == [item.id for item in theirs]
        assert all(a.logprob is None or abs(a.logprob - b.logprob) < 1e-3 for a, b in zip(mine, theirs))
        assert [[token for token, _ in item.top] for item in mine] == [[token for token, _ in item.top] for item in theirs]
