"""The benchmark corpus: realistic texts of varied length, fixed and seeded, shipped with the project.

`hf2triton/data/sentences.txt` holds 60 hand-written sentences (reviews, support tickets, news, recipes,
code and a few non-English ones); texts are built from them with a seeded generator, so every run and
every machine measures the same inputs.
"""

from __future__ import annotations

import random
from pathlib import Path

SENTENCES = Path(__file__).resolve().parent / "data" / "sentences.txt"


def sentences() -> list[str]:
    return [line.strip() for line in SENTENCES.read_text(encoding="utf-8").splitlines() if line.strip()]


def bench_texts(count: int = 512, min_words: int = 20, max_words: int = 90, seed: int = 0) -> list[str]:
    """`count` texts of min_words..max_words words: consecutive-in-spirit runs of random sentences, cut to
    the drawn length (a text always ends at a word boundary)."""
    pool = sentences()
    rng = random.Random(seed)  # noqa: S311 - reproducible benchmark inputs, not cryptography
    texts = []
    for _ in range(count):
        target = rng.randint(min_words, max_words)
        words: list[str] = []
        while len(words) < target:
            words.extend(rng.choice(pool).split())
        texts.append(" ".join(words[:target]))
    return texts
