"""The text tasks' validation probes: the texts every served model answers (PROBES, per task) and the parity set a
non-torch backend is held to against torch (PARITY_PROBES for encoders, PARITY_GENERATION_PROMPTS for decoders)."""

from __future__ import annotations

from hf2triton.serving import interface

PROBES = {
    interface.FEATURE_EXTRACTION: [
        "The quick brown fox jumps over the lazy dog.",
        "Triton sert des modèles — ça marche très bien.",
        "東京は日本の首都です。",
    ],
    interface.CLASSIFICATION: ["I loved this film, it was wonderful.", "Terrible service, never again.", "Un repas correct, sans plus."],
    interface.GENERATION: ["What is the capital of France?"],
    interface.TEXT2TEXT: ["translate English to German: The house is wonderful.", "summarize: The dragon met the knight at dawn."],
    interface.TOKEN_CLASSIFICATION: [
        "Angela Merkel met Emmanuel Macron in Paris on Tuesday.",
        "Hugging Face Inc. is based in New York City; its CEO is Clément Delangue.",
        "Ada Lovelace wohnte in London, 東京 ist weit weg.",
    ],
    interface.FILL_MASK: [  # {mask}: the model's own mask token (pipeline_answers.probe_texts)
        "Paris is the {mask} of France.",
        "The cat sat on the {mask}, purring.",
        "Ich trinke gern {mask} am Morgen; 東京 ist weit weg.",
    ],
    interface.TEXT_RANKING: [  # the documents ranked against RANKING_QUERY
        "Paris is the capital and largest city of France.",
        "The cat sat on the mat, purring.",
        "Berlin ist die Hauptstadt Deutschlands; 東京 ist weit weg.",
    ],
}
RANKING_QUERY = "What is the capital of France?"
_SUBJECTS = ["the weather", "a new phone", "this restaurant", "la réunion", "das Konzert", "el viaje", "東京の夜", "the quarterly report"]
_VERBS = ["was surprisingly good", "disappointed everyone", "changed my mind", "ist ausgezeichnet", "fue increíble", "は静かだった"]
# Parity probes: 40 texts of varied length (3 to ~60 words), several scripts and languages.
PARITY_PROBES = [
    f"{_SUBJECTS[i % len(_SUBJECTS)]} {_VERBS[i % len(_VERBS)]}"
    + (" and " + " ".join(["more", "details", "follow"] * (i % 20)) if i % 3 else "")
    for i in range(40)
]
PARITY_GENERATION_PROMPTS = [
    "What is the capital of France?",
    "Name three colours.",
    "Translate 'good morning' to French.",
    "What is 2 + 2?",
]
