"""Probe (issue 44): what the torch engine's grammar mask costs per decoding step on this machine's CPU, for 32 guided
rows over SmolLM2's 49,152-token vocabulary (a JSON schema, each matcher inside an object), and the ways to apply it.

    .venv/bin/python benchmarks/probes/grammar_mask.py            # this machine's CPU
    python benchmarks/probes/grammar_mask.py cuda                 # the GPU path (device.sh grammar-mask)

Prints milliseconds per step (median of 5 runs of 20): filling the bitmasks one matcher at a time (into one reused
bitmask, as grammar.py does since 2026-12-06, and into a new one per step, as before) and together on xgrammar's
threads, and applying them to a copy of the logits with grammar.py's numpy unpacking + one masked_fill,
grammar.py's mask before 2026-12-05, xgrammar's own CPU kernel, and xgrammar's torch_native kernel (what the GPU path
falls back to without triton); then Grammars.mask as the batcher calls it (the copy included).

With `cuda` (issue 44: on an H100 the torch engine decoded 32 guided rows at 0.53x the free ITL, 6.7 ms more per step,
where the CPU work above is well under 1 ms): the logits on the GPU, every figure synchronised, and the GPU path's
parts -- the bitmask copied to the GPU, xgrammar's triton and torch_native kernels, Grammars.mask in place as the
slots batcher calls it (no logprobs: no copy), and the indices as a tensor vs a list.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hf2triton.serving.batching.grammar import Grammars, _mask_on_cpu  # noqa: E402
from tests.helpers import smollm2_gguf  # noqa: E402

ROWS = 32
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "age", "tags"],
}


def earlier_apply(torch, logits, bitmask, rows: list[int]):
    """The mask as grammar.py applied it before 2026-12-05 (bits shifted out on the logits' device, a copy indexed)."""
    shifts = torch.arange(32, dtype=torch.int32)
    allowed = ((bitmask[:, :, None] >> shifts) & 1).bool().reshape(len(rows), -1)[:, : logits.shape[-1]]
    allowed[~allowed.any(-1)] = True
    index = torch.tensor(rows)
    scores = logits.clone()
    scores[index] = scores[index].masked_fill(~allowed, float("-inf"))
    return scores


def per_step_ms(work, runs: int = 5, steps: int = 20, sync=lambda: None) -> float:
    work()  # the first call compiles a kernel (triton) or warms a cache: not a step
    sync()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        for _ in range(steps):
            work()
        sync()
        times.append((time.perf_counter() - started) / steps * 1000)
    return round(statistics.median(times), 3)


def gpu_figures(torch, xgr, grammars, sequences, bitmask, rows: list[int], vocabulary: int) -> dict[str, float]:
    """The GPU path's parts, each synchronised (the batcher's next step waits for all of them)."""
    sync = torch.cuda.synchronize
    logits = torch.randn(len(rows), vocabulary, device="cuda")
    on_gpu = bitmask.to("cuda")
    index = torch.tensor(rows, dtype=torch.int32, device="cuda")
    pinned = bitmask.pin_memory()

    def kernel(backend: str, indices) -> Callable[[], None]:
        return lambda: xgr.apply_token_bitmask_inplace(logits, on_gpu, vocab_size=vocabulary, indices=indices, backend=backend)

    return {
        "GPU: bitmask to the GPU (pageable)": per_step_ms(lambda: bitmask.to("cuda"), sync=sync),
        "GPU: bitmask to the GPU (pinned, non_blocking)": per_step_ms(lambda: pinned.to("cuda", non_blocking=True), sync=sync),
        "GPU: xgrammar's triton kernel, indices a list": per_step_ms(kernel("triton", rows), sync=sync),
        "GPU: xgrammar's triton kernel, indices a GPU tensor": per_step_ms(kernel("triton", index), sync=sync),
        "GPU: xgrammar's triton kernel, no indices": per_step_ms(kernel("triton", None), sync=sync),
        "GPU: xgrammar's torch_native kernel, indices a list": per_step_ms(kernel("torch_native", rows), sync=sync),
        "GPU: Grammars.mask in place (fill + pinned copy up + kernel)": per_step_ms(
            lambda: grammars.mask(torch, sequences, logits, copy=False), sync=sync
        ),
        "GPU: Grammars.mask + argmax().tolist() (the sampling's sync)": per_step_ms(
            lambda: grammars.mask(torch, sequences, logits, copy=False).argmax(-1).tolist()
        ),
        "GPU: argmax().tolist() alone (a free step's sampling)": per_step_ms(lambda: logits.argmax(-1).tolist()),
    }


def main() -> int:
    import torch
    import xgrammar as xgr
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_gguf().parent, gguf_file=smollm2_gguf().name)
    vocabulary = len(tokenizer)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocabulary, stop_token_ids=[tokenizer.eos_token_id])
    compiled = xgr.GrammarCompiler(info, max_threads=2).compile_grammar(xgr.Grammar.from_json_schema(json.dumps(SCHEMA)))
    prefix = tokenizer.encode('{"name": "Alice Smith", "age": 3', add_special_tokens=False)
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(ROWS)]
    for matcher in matchers:
        assert all(matcher.accept_token(token) for token in prefix)
    rows = list(range(ROWS))
    bitmask = xgr.allocate_token_bitmask(ROWS, vocabulary)
    batch = xgr.BatchGrammarMatcher(max_threads="auto")
    logits = torch.randn(ROWS, vocabulary)
    grammars = Grammars(tokenizer, vocabulary, {tokenizer.eos_token_id})
    sequences = [SimpleNamespace(matcher=matcher) for matcher in matchers]

    def one_by_one() -> None:
        for row, matcher in enumerate(matchers):
            matcher.fill_next_token_bitmask(bitmask, row)

    def into_a_new_bitmask() -> None:  # what grammar.py did until 2026-12-06: a 196 KB tensor per step
        fresh = xgr.allocate_token_bitmask(ROWS, vocabulary)
        for row, matcher in enumerate(matchers):
            matcher.fill_next_token_bitmask(fresh, row)

    figures = {
        "fill one matcher at a time": per_step_ms(one_by_one),
        "fill one at a time into a new bitmask (allocated per step)": per_step_ms(into_a_new_bitmask),
        "fill together (BatchGrammarMatcher)": per_step_ms(lambda: batch.batch_fill_next_token_bitmask(matchers, bitmask, rows)),
        "copy of the logits": per_step_ms(logits.clone),
        "apply: numpy unpack + masked_fill (ours)": per_step_ms(lambda: _mask_on_cpu(torch, logits.clone(), bitmask, rows, vocabulary)),
        "apply: the earlier shifts + index + masked_fill (copy incl.)": per_step_ms(lambda: earlier_apply(torch, logits, bitmask, rows)),
        "apply: xgrammar's CPU kernel": per_step_ms(
            lambda: xgr.apply_token_bitmask_inplace(logits.clone(), bitmask, vocab_size=vocabulary, indices=rows, backend="cpu")
        ),
        "apply: xgrammar's torch_native kernel": per_step_ms(
            lambda: xgr.apply_token_bitmask_inplace(logits.clone(), bitmask, vocab_size=vocabulary, indices=rows, backend="torch_native")
        ),
        "Grammars.mask (fill + copy + apply)": per_step_ms(lambda: grammars.mask(torch, sequences, logits)),
    }
    if len(sys.argv) > 1 and sys.argv[1] == "cuda":
        figures.update(gpu_figures(torch, xgr, grammars, sequences, bitmask, rows, vocabulary))
    print(f"{ROWS} guided rows x {vocabulary:,} tokens, torch threads {torch.get_num_threads()}, ms per decoding step:")
    for name, value in figures.items():
        print(f"  {name:<62} {value:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
