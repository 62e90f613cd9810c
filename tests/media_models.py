"""Tiny random image and speech models built locally (no hub) for the image / speech tests and their ONNX tests: ViT,
ConvNeXT, CLIP, SigLIP with their image processors, and a 1-layer Whisper with a BPE tokenizer trained here.

The tiny CLIP and SigLIP use a BERT WordPiece tokenizer (the MiniLM one the other tests use; no token_type_ids): a
CLIPTokenizer's BPE files or SigLIP's sentencepiece model cannot be had offline, and the pipeline only calls the
tokenizer, whatever it is. The Whisper tokenizer is a byte-level BPE plus Whisper's special tokens and a generation
config with their ids."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import minilm_dir

LABELS = {0: "cat", 1: "dog", 2: "bird"}
LANGUAGES = ("en", "de", "fr")
MAX_TOKENS = 12  # the tiny Whisper's generation_config.max_length: random weights never stop by themselves
TEXT = {"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 64}
VISION = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2, "num_attention_heads": 2}


def text_tokenizer(inputs: list[str] | None = None):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_dir(), model_input_names=inputs or ["input_ids", "attention_mask"])


def build_image_models(root: Path) -> dict[str, Path]:
    """Tiny random ViT and ConvNeXT classifiers, CLIP and SigLIP, each with its image processor, saved like hub repos
    under `root`."""
    import torch
    from transformers import (
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        ConvNextConfig,
        ConvNextForImageClassification,
        ConvNextImageProcessor,
        SiglipConfig,
        SiglipImageProcessor,
        SiglipModel,
        ViTConfig,
        ViTForImageClassification,
        ViTImageProcessor,
    )

    torch.manual_seed(0)
    label2id = {v: k for k, v in LABELS.items()}
    vit = ViTConfig(**VISION, num_labels=3, id2label=LABELS, label2id=label2id)
    convnext = ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=4, image_size=32)
    tokenizer = text_tokenizer()
    text = {**TEXT, "vocab_size": tokenizer.vocab_size}
    clip = CLIPConfig(
        text_config={**text, "eos_token_id": tokenizer.sep_token_id, "pad_token_id": 0}, vision_config=VISION, projection_dim=16
    )
    models = {
        "vit": (ViTForImageClassification(vit), ViTImageProcessor(size={"height": 32, "width": 32}), None),
        "convnext": (ConvNextForImageClassification(convnext), ConvNextImageProcessor(size={"shortest_edge": 32}), None),
        "clip": (CLIPModel(clip), CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}), tokenizer),
        "siglip": (
            SiglipModel(SiglipConfig(text_config=text, vision_config=VISION)),
            SiglipImageProcessor(size={"height": 32, "width": 32}),
            tokenizer,
        ),
    }
    paths = {}
    for name, parts in models.items():
        paths[name] = root / name
        for part in parts:
            if part is not None:
                part.save_pretrained(paths[name])
    return paths
    return paths


def build_tiny_whisper(directory: Path) -> Path:
    """A random 1-layer Whisper (d_model 32) with its feature extractor and a WhisperTokenizerFast over a BPE trained
    here, saved like a hub repo (the bench's builder, benchmarks/tasks/build_media.py, at the tiniest size)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from benchmarks.tasks.build_media import whisper_checkpoint

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(["the quick brown fox jumps over the lazy dog", "hello world, speech recognition"] * 20, trainer)
    bpe.add_special_tokens(["<|endoftext|>"])  # after the text tokens, as Whisper's (its prompt check relies on that)
    directory.mkdir(parents=True, exist_ok=True)
    bpe.save(str(directory / "tokenizer.json"))
    return whisper_checkpoint(directory, {"d_model": 32, "layers": 1, "heads": 2, "ffn": 32}, LANGUAGES, MAX_TOKENS)


def build_tiny_ctc(directory: Path) -> Path:
    """A random 1-layer wav2vec2 (Wav2Vec2ForCTC) with a char-level CTC tokenizer made here and its feature extractor."""
    import json

    import torch
    from transformers import Wav2Vec2Config, Wav2Vec2CTCTokenizer, Wav2Vec2FeatureExtractor, Wav2Vec2ForCTC

    directory.mkdir(parents=True)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "|": 4, **{c: 5 + i for i, c in enumerate("abcdefghij")}}
    (directory / "vocab.json").write_text(json.dumps(vocab))
    config = Wav2Vec2Config(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=37,
        conv_dim=(16, 16),
        conv_stride=(5, 4),
        conv_kernel=(10, 8),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    Wav2Vec2ForCTC(config).eval().save_pretrained(directory)
    Wav2Vec2CTCTokenizer(str(directory / "vocab.json")).save_pretrained(directory)
    Wav2Vec2FeatureExtractor(sampling_rate=16000, return_attention_mask=False).save_pretrained(directory)
    return directory
