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
    """A random 1-layer Whisper (d_model 32) with its feature extractor and a WhisperTokenizerFast, saved like a hub repo."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"])
    bpe.train_from_iterator(["the quick brown fox jumps over the lazy dog", "hello world, speech recognition"] * 20, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    bpe.save(str(directory / "tokenizer.json"))
    eot = "<|endoftext|>"
    tokenizer = WhisperTokenizerFast(
        tokenizer_file=str(directory / "tokenizer.json"), unk_token=eot, bos_token=eot, eos_token=eot, pad_token=eot
    )
    specials = ["<|startoftranscript|>", *[f"<|{code}|>" for code in LANGUAGES], "<|translate|>", "<|transcribe|>"]
    specials += ["<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.add_tokens([f"<|{i * 0.02:.2f}|>" for i in range(1501)])  # after <|notimestamps|>, as Whisper's
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in specials}
    end = tokenizer.convert_tokens_to_ids(eot)
    special = {"decoder_start_token_id": ids["<|startoftranscript|>"], "eos_token_id": end, "pad_token_id": end, "bos_token_id": end}
    config = WhisperConfig(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        num_mel_bins=80,
        max_source_positions=1500,  # 30 s of audio: 3000 frames, 1500 after the conv stride
        max_target_positions=448,
        **special,
    )
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(
        **special,
        lang_to_id={f"<|{code}|>": ids[f"<|{code}|>"] for code in LANGUAGES},
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        no_timestamps_token_id=ids["<|notimestamps|>"],
        prev_sot_token_id=ids["<|startofprev|>"],
        is_multilingual=True,
        suppress_tokens=[],
        begin_suppress_tokens=[end],
        max_length=MAX_TOKENS,
        max_initial_timestamp_index=50,
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    WhisperFeatureExtractor().save_pretrained(directory)
    return directory
