"""Issue 25 #3: the torch generation engine on a GPU -- the preallocated KV cache replaying CUDA graphs (SlotBatcher)
decodes the same greedy tokens as the dynamic cache, through joins, leaves and padded buckets, and the served model
picks it after its probe. Runs where torch has a CUDA GPU (the H200 through benchmarks/gpu/device.sh); elsewhere it
is skipped with the reason (the same batcher runs eagerly on the CPU in tests/test_continuous_batching.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: CUDA graphs over the preallocated KV cache")

from hf2triton.serving.batching.continuous import ContinuousBatcher  # noqa: E402
from hf2triton.serving.batching.sequences import Sampling, Sequence  # noqa: E402
from hf2triton.serving.batching.slots import SlotBatcher, new_batcher  # noqa: E402

PROMPTS = ["What is the capital of France?", "Hi", "Tell me a very long story about a dragon and a knight", "你好，介绍一下你自己"]


@pytest.fixture(scope="module")
def llm(tiny_models):
    import transformers

    path = tiny_models["text-generation"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path).to("cuda:0").eval()
    return model, tokenizer


def staggered(batcher, tokenizer) -> list[list[int]]:
    """Ten sequences of different lengths through 3 slots, joining while others run."""
    sequences = [
        Sequence(
            tokenizer(PROMPTS[i % 4], add_special_tokens=False)["input_ids"], Sampling(max_new_tokens=5 + 7 * i % 23), lambda t, f: None
        )
        for i in range(10)
    ]
    for index, sequence in enumerate(sequences):
        batcher.submit(sequence)
        if index % 3 == 2:
            for _ in range(4):
                batcher.step()
    while not batcher.idle:
        batcher.step()
    return [sequence.generated for sequence in sequences]


def test_graphs_over_slots_decode_the_dynamic_cache_s_greedy_tokens(llm):
    limits = {"max_sequences": 3, "max_queue": 16, "context": 512}
    expected = staggered(ContinuousBatcher(*llm, "cuda:0", **limits), llm[1])
    graphs = SlotBatcher(*llm, "cuda:0", cuda_graphs=True, **limits)
    assert staggered(graphs, llm[1]) == expected
    assert graphs.use_graphs and not graphs.graph_failure and graphs.graphs, "the steps replayed captured graphs"
    assert staggered(SlotBatcher(*llm, "cuda:0", cuda_graphs=False, **limits), llm[1]) == expected


def test_the_served_batcher_on_a_gpu_is_the_graph_one(llm):
    lines: list[str] = []
    batcher = new_batcher(*llm, "cuda:0", cuda_graphs=True, log=lines.append, max_sequences=8, max_queue=8, context=512)
    assert isinstance(batcher, SlotBatcher) and batcher.use_graphs, lines
    assert "CUDA graphs on" in lines[-1]
    # issue 46: every row bucket captured at load for the first two column buckets, and the texts after it unchanged
    assert set(batcher.graphs) == {(rows, columns) for rows in (1, 2, 4, 8) for columns in (128, 256)}, lines
    assert any("captured 8 decoding steps (rows 1-8 x columns 128-256)" in line for line in lines), lines
    limits = {"max_sequences": 8, "max_queue": 16, "context": 512}
    assert staggered(batcher, llm[1]) == staggered(ContinuousBatcher(*llm, "cuda:0", **limits), llm[1])
