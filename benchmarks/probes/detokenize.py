"""Probe (issue 46): what the batcher's incremental detokenisation costs per token on its thread, SmolLM2's tokenizer.

    .venv/bin/python benchmarks/probes/detokenize.py --out benchmarks/generation-2cpu/detokenize.json

text.new_text decodes two windows of the answer's last tokens per token (text-generation-inference's and vLLM's
method). Three ways, the same answer streamed token by token, alternating rounds: through transformers' `decode`
(its wrapper), through `fast_decode` (the Rust backend directly: the same text), the batchers' whole per-token path
(`text.append_token`: fast_decode's raw windows and the clean-up in `text.cleaned_text`, stop-string checks), and
tokenizers' `DecodeStream` (one call per token; no clean-up of spaces, so not the same text for tokenizers that
clean up, as SmolLM2's loaded from its GGUF file does)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hf2triton.serving.batching.sequences import Sampling, Sequence  # noqa: E402
from hf2triton.serving.batching.text import Detokenizer, append_token, detokenizer, fast_decode, new_text  # noqa: E402
from tests.helpers import smollm2_gguf  # noqa: E402

ANSWER = (
    "Paris is the capital and most populous city of France. With an estimated population of 2,102,650 residents in "
    "January 2023 in an area of more than 105 km², Paris is the fourth-most populous city in the European Union. "
    "Ünïcödé, emoji 🙂 and code: def f(x): return x ** 2\n"
) * 4


def streamed(decode, ids: list[int]) -> str:
    sequence = Sequence([0], Sampling(max_new_tokens=len(ids)), lambda text, finish: None)
    text = ""
    for token in ids:
        sequence.generated.append(token)
        text += new_text(decode, sequence)
    return text


def batcher_stream(detokenize: Detokenizer, ids: list[int]) -> str:
    """What the batchers do per token (text.append_token): fast_decode's raw windows, the clean-up in text.cleaned_text
    (before 2026-12-06: Detokenizer(tokenizer.decode), transformers' decode cleaning up each window)."""
    pieces: list[str] = []
    sequence = Sequence([0], Sampling(max_new_tokens=len(ids) + 1), lambda text, finish: None)
    for token in ids:
        append_token(sequence, token, set(), 10**6, detokenize, lambda _, piece: pieces.append(piece))
    return "".join(pieces) + sequence.text[sequence.sent :]


def decode_stream(tokenizer, ids: list[int]) -> str:
    from tokenizers.decoders import DecodeStream

    stream, text = DecodeStream(skip_special_tokens=True), ""
    for token in ids:
        text += stream.step(tokenizer._tokenizer, token) or ""
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20, help="answers streamed per way and round")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_gguf().parent, gguf_file=smollm2_gguf().name)
    ids = tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
    ways = {
        "transformers_decode": lambda: streamed(tokenizer.decode, ids),
        "fast_decode": lambda: streamed(fast_decode(tokenizer), ids),
        "batcher_append_token_before": lambda: batcher_stream(Detokenizer(tokenizer.decode), ids),
        "batcher_append_token": lambda: batcher_stream(detokenizer(tokenizer), ids),
        "decode_stream": lambda: decode_stream(tokenizer, ids),
    }
    texts = {name: way() for name, way in ways.items()}
    per_token: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, way in ways.items():
            started = time.perf_counter()
            for _ in range(args.repeats):
                way()
            per_token[name].append(1e6 * (time.perf_counter() - started) / args.repeats / len(ids))
    medians = {name: round(statistics.median(values), 2) for name, values in per_token.items()}
    result = {
        "tokens": len(ids),
        "us_per_token_median": medians,
        "us_per_token_rounds": {name: [round(v, 2) for v in values] for name, values in per_token.items()},
        "speedup_vs_transformers_decode": {name: round(medians["transformers_decode"] / v, 2) for name, v in medians.items()},
        "same_text_as_transformers_decode": {name: text == texts["transformers_decode"] for name, text in texts.items()},
        "same_text_as_the_whole_decode": {name: text == tokenizer.decode(ids, skip_special_tokens=True) for name, text in texts.items()},
        "clean_up_tokenization_spaces": bool(tokenizer.clean_up_tokenization_spaces),
        "command": "python " + " ".join(sys.argv),
        "measured_at": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
