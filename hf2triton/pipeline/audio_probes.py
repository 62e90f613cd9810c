"""The speech task's validation probes: synthetic audio made here (no download: a chirp and a two-tone signal, fixed),
encoded as WAV at the model's 16 kHz and as FLAC at 8 kHz (so the served path resamples), and its reference:
transformers' own `pipeline("automatic-speech-recognition")` in-process on the same samples (decoded and resampled
as the server does: the pipeline itself would need ffmpeg for files and torchaudio to resample)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from hf2triton.serving import interface


def synthetic_audio(seconds: float, rate: int, seed: int = 0) -> np.ndarray:
    """A fixed signal: a rising chirp plus a tone whose pitch depends on `seed`, with a slow tremolo (float32 mono)."""
    t = np.arange(int(seconds * rate)) / rate
    chirp = np.sin(2 * np.pi * (150 + 200 * t) * t)
    tone = np.sin(2 * np.pi * (330 + 110 * seed) * t)
    return (0.25 * (chirp + tone) * (0.6 + 0.4 * np.sin(2 * np.pi * 1.5 * t))).astype(np.float32)


def encoded_audio(samples: np.ndarray, rate: int, audio_format: str) -> bytes:
    """Samples as a file's bytes (soundfile: WAV 16-bit PCM, FLAC, OGG Vorbis, MP3)."""
    import soundfile

    buffer = io.BytesIO()
    subtype = {"WAV": "PCM_16", "FLAC": "PCM_16", "OGG": "VORBIS", "MP3": "MPEG_LAYER_III"}[audio_format]
    soundfile.write(buffer, samples, rate, format=audio_format, subtype=subtype)
    return buffer.getvalue()


def probe_audios() -> list[bytes]:
    """Validation's two audios: 3 s of WAV at 16 kHz, 2 s of FLAC at 8 kHz."""
    return [encoded_audio(synthetic_audio(3.0, 16000, 0), 16000, "WAV"), encoded_audio(synthetic_audio(2.0, 8000, 1), 8000, "FLAC")]


def pipeline_speech_answers(
    model_dir: str, audios: list[bytes], device: str = "cpu", dtype: str = "auto", **options: Any
) -> dict[str, np.ndarray]:
    """`transformers.pipeline("automatic-speech-recognition")` per audio (decoded and resampled to the feature
    extractor's rate as the server does), its text per audio (BYTES, as served). `options`: the pipeline's
    (return_timestamps, generate_kwargs)."""
    from transformers import AutoFeatureExtractor, pipeline

    from hf2triton.serving.audio import decode_audio

    rate = int(AutoFeatureExtractor.from_pretrained(model_dir).sampling_rate)
    recognizer = pipeline(interface.SPEECH_RECOGNITION, model=model_dir, device=device, dtype=dtype)
    texts = [recognizer({"raw": decode_audio(audio, rate, float("inf")), "sampling_rate": rate}, **options)["text"] for audio in audios]
    return {interface.TEXT_OUTPUT: np.array([text.encode("utf-8") for text in texts], dtype=np.object_)}
