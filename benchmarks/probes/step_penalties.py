"""What a checkpoint's repetition_penalty and OpenAI's presence / frequency penalties cost the torch batcher per
decoding step, on SmolLM2's vocabulary (49,152): `StepSettings.apply` (one gather / scatter for the batch where the
penalty is the checkpoint's only setting) vs the per-row transformers processor chain it replaced for that case, and
`text.penalized` for rows that ask for OpenAI's penalties; every way's logits checked equal. Rows of 512 prompt + 128
answer tokens, alternating rounds, medians.

    .venv/bin/python benchmarks/probes/step_penalties.py [ROUNDS]
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from hf2triton.serving.batching.sequences import Sampling, Sequence
from hf2triton.serving.batching.settings import StepSettings
from hf2triton.serving.batching.text import penalized

VOCABULARY, PROMPT, ANSWER, STEPS = 49_152, 512, 128, 20


def rows(count: int, **sampling) -> list[Sequence]:
    made = []
    for _ in range(count):
        sequence = Sequence(torch.randint(VOCABULARY, (PROMPT,)).tolist(), Sampling(max_new_tokens=ANSWER, **sampling), None)
        sequence.generated = torch.randint(VOCABULARY, (ANSWER,)).tolist()
        made.append(sequence)
    return made


def decoder_ids(sequence: Sequence) -> tuple[list[int], int]:
    return [*sequence.prompt_ids, *sequence.generated], len(sequence.prompt_ids)


def per_step_ms(step, logits) -> float:
    started = time.perf_counter()
    for _ in range(STEPS):
        step(logits)
    return 1000 * (time.perf_counter() - started) / STEPS


def main(rounds: int) -> dict:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    settings = StepSettings(repetition_penalty=1.1)
    results: dict = {}
    for count in (8, 32):
        batch, asking = rows(count), rows(count, presence_penalty=0.5, frequency_penalty=0.3)
        logits = torch.randn(count, VOCABULARY)
        ways = {
            "repetition batched (apply)": lambda x, b=batch: settings.apply(torch, b, x, decoder_ids),
            "repetition per row (processors)": lambda x, b=batch: settings.per_row(torch, b, x, decoder_ids),
            "presence+frequency (penalized)": lambda x, b=asking: penalized(torch, b, x),
            "none (penalized, no row asks)": lambda x, b=batch: penalized(torch, b, x),
        }
        assert torch.equal(ways["repetition batched (apply)"](logits), ways["repetition per row (processors)"](logits))
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(rounds):
            for name, step in ways.items():
                times[name].append(per_step_ms(step, logits))
        results[f"{count} rows"] = {name: round(statistics.median(values), 3) for name, values in times.items()}
    return results


if __name__ == "__main__":
    out = main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
    print(json.dumps(out, indent=1))
