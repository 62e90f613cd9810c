"""A request's audio decoded, bounded and resampled (automatic-speech-recognition): each row of the AUDIO tensor is one
audio file (WAV, FLAC, OGG/Vorbis or MP3: what the libsndfile inside soundfile's wheel reads), or, with a sampling
rate given, raw float32 little-endian mono samples.

The duration is bounded before any sample is decoded: soundfile reads the header (frames and rate) first, so a file
whose duration exceeds max_audio_seconds (a few kilobytes of FLAC silence can decode to gigabytes) is refused from it.
Several channels are averaged to one (as transformers' ffmpeg_read asks ffmpeg for mono); the samples are resampled to
the model's rate with scipy's polyphase filter (resample_poly). A problem with one audio raises RequestError: its
request gets the error, the rest of the batch is unaffected.
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np

from .inputs import RequestError

FORMATS = ("WAV", "FLAC", "OGG", "MP3")  # libsndfile >= 1.1 reads MP3


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Mono float32 samples from `rate` to `target` Hz (polyphase, scipy's default Kaiser window)."""
    if rate == target:
        return samples.astype(np.float32, copy=False)
    from scipy.signal import resample_poly

    divisor = math.gcd(rate, target)
    return resample_poly(samples, target // divisor, rate // divisor).astype(np.float32)


def decode_audio(raw: Any, target_rate: int, max_seconds: float, index: int = 0, raw_rate: int | None = None) -> np.ndarray:
    """One audio (a file's bytes, or raw float32 samples at `raw_rate`) -> mono float32 samples at `target_rate`,
    refused beyond `max_seconds` before decoding."""
    if isinstance(raw, str) or not isinstance(raw, (bytes, np.bytes_)):
        raise RequestError(f"audio {index}: input 'audio' must be BYTES (the audio file), got {type(raw).__name__}")
    if not raw:
        raise RequestError(f"audio {index} is empty: send the bytes of a WAV, FLAC, OGG or MP3 file")
    if raw_rate is not None:  # raw samples
        if len(raw) % 4:
            raise RequestError(f"audio {index}: raw samples are float32 (4 bytes each), got {len(raw)} bytes")
        seconds = len(raw) / 4 / raw_rate
        _check_duration(seconds, max_seconds, index)
        samples = np.frombuffer(bytes(raw), dtype="<f4")
        if not np.isfinite(samples).all():
            raise RequestError(f"audio {index}: raw samples hold NaN or infinity")
        return resample(samples, raw_rate, target_rate)
    import soundfile

    try:
        with soundfile.SoundFile(io.BytesIO(bytes(raw))) as audio:
            if audio.format not in FORMATS:
                raise RequestError(f"audio {index} is {audio.format}: send one of {', '.join(FORMATS)}")
            if audio.samplerate <= 0 or audio.frames <= 0:
                raise RequestError(f"audio {index} holds no samples")
            _check_duration(audio.frames / audio.samplerate, max_seconds, index)
            samples = audio.read(dtype="float32", always_2d=True)
            rate = audio.samplerate
    except RequestError:
        raise
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as err:
        head = bytes(raw[:16])
        raise RequestError(
            f"audio {index} ({len(raw)} bytes, starting {head!r}) is not audio soundfile can read ({err}): "
            f"send the bytes of a {', '.join(FORMATS)} file"
        ) from None
    if not len(samples):
        raise RequestError(f"audio {index} holds no samples")
    return resample(samples.mean(axis=1), rate, target_rate)


def _check_duration(seconds: float, max_seconds: float, index: int) -> None:
    if seconds > max_seconds:
        raise RequestError(f"audio {index} is {seconds:.1f} s long, more than max_audio_seconds={max_seconds:g}: send a shorter one")


def decode_audios(values: np.ndarray, target_rate: int, max_seconds: float, raw_rate: int | None = None) -> list[np.ndarray]:
    """The audios of a request (rows of the AUDIO tensor), each decoded, checked and resampled."""
    audios = [decode_audio(item, target_rate, max_seconds, index, raw_rate) for index, item in enumerate(values.reshape(-1))]
    if not audios:
        raise RequestError("request holds no audio")
    return audios
