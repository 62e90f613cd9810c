"""A request's audio decoded, bounded and resampled (automatic-speech-recognition): each row of the AUDIO tensor is one
audio file (what the libsndfile inside soundfile's wheel reads: WAV, its WAVE_FORMAT_EXTENSIBLE, RF64 and W64 forms,
FLAC, OGG (Vorbis, Opus), MP3, AIFF, CAF), or, with a sampling rate given, raw float32 little-endian mono samples.

Everything a file's header claims is bounded before any sample is decoded: soundfile reads the header (frames,
rate, channels) first, so a file whose duration exceeds max_audio_seconds (a few kilobytes of FLAC silence can
decode to gigabytes), whose rate is outside SAMPLING_RATE_RANGE (the raw samples' range too), or whose frames x
channels exceed max_audio_seconds of 96 kHz stereo is refused from it. Channels are averaged to one (as transformers'
ffmpeg_read asks ffmpeg for mono) a block at a time, so memory holds the mono samples, not every channel's. The samples
are resampled to the model's rate with scipy's polyphase filter (resample_poly) at the exact ratio for the usual rates,
an odd one's ratio approximated (its filter's length grows with the ratio's terms). A problem with one audio, running
out of memory included, raises RequestError: its request gets the error, the rest of the batch is unaffected.
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import Any

import numpy as np

from . import interface
from .inputs import RequestError

# soundfile's format names (libsndfile >= 1.1 reads MP3); WAVEX: WAV in WAVE_FORMAT_EXTENSIBLE layout, which ffmpeg
# writes for more than 16 bits, 48 kHz or 2 channels
FORMATS = ("WAV", "WAVEX", "RF64", "W64", "FLAC", "OGG", "MP3", "AIFF", "CAF")
# resample_poly designs a filter of 20 * max(up, down) + 1 taps (a prime rate near 384 kHz: 7.7 M, seconds and
# hundreds of MB); terms up to this keep every usual pair of rates exact (44.1 kHz -> 16 kHz is 160/441) and an odd
# rate's ratio within about 1e-4 (its filter: 200 k taps, milliseconds)
MAX_RATIO_TERM = 10_000
MAX_SAMPLES_PER_SECOND = 2 * 96_000  # frames x channels per second of max_audio_seconds: 96 kHz stereo
BLOCK_FRAMES = 1 << 16  # frames read (and averaged to mono) at a time


def resample_ratio(rate: int, target: int) -> tuple[int, int]:
    """resample_poly's (up, down) from `rate` to `target` Hz: target/rate exactly where both its terms are at most
    MAX_RATIO_TERM, else the nearest fraction whose terms are."""
    if target <= rate:
        ratio = Fraction(target, rate).limit_denominator(MAX_RATIO_TERM)
        return max(ratio.numerator, 1), ratio.denominator
    ratio = Fraction(rate, target).limit_denominator(MAX_RATIO_TERM)
    return ratio.denominator, max(ratio.numerator, 1)


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Mono float32 samples from `rate` to `target` Hz (polyphase, scipy's default Kaiser window)."""
    if rate == target:
        return samples.astype(np.float32, copy=False)
    from scipy.signal import resample_poly

    return resample_poly(samples, *resample_ratio(rate, target)).astype(np.float32)


def decode_audio(raw: Any, target_rate: int, max_seconds: float, index: int = 0, raw_rate: int | None = None) -> np.ndarray:
    """One audio (a file's bytes, or raw float32 samples at `raw_rate`) -> mono float32 samples at `target_rate`,
    refused beyond `max_seconds` (or an unusable rate, too many channels) before decoding."""
    if isinstance(raw, str) or not isinstance(raw, (bytes, np.bytes_)):
        raise RequestError(f"audio {index}: input 'audio' must be BYTES (the audio file), got {type(raw).__name__}")
    if not raw:
        raise RequestError(f"audio {index} is empty: send the bytes of an audio file ({', '.join(FORMATS)})")
    try:
        if raw_rate is not None:
            samples, rate = _raw_samples(raw, raw_rate, max_seconds, index), raw_rate
        else:
            samples, rate = _file_samples(raw, target_rate, max_seconds, index)
        return resample(samples, rate, target_rate)
    except MemoryError:  # this request's, not the batch's (the bounds above keep it rare)
        raise RequestError(
            f"audio {index} ({len(raw)} bytes): the server ran out of memory decoding it: send a shorter audio, mono at {target_rate} Hz"
        ) from None


def _raw_samples(raw: bytes, rate: int, max_seconds: float, index: int) -> np.ndarray:
    if len(raw) % 4:
        raise RequestError(f"audio {index}: raw samples are float32 (4 bytes each), got {len(raw)} bytes")
    _check_rate(rate, index, "its sampling_rate is")
    _check_duration(len(raw) / 4 / rate, max_seconds, index)
    samples = np.frombuffer(bytes(raw), dtype="<f4")
    if not np.isfinite(samples).all():
        raise RequestError(f"audio {index}: raw samples hold NaN or infinity")
    return samples


def _file_samples(raw: bytes, target_rate: int, max_seconds: float, index: int) -> tuple[np.ndarray, int]:
    """A file's samples averaged to mono, and its rate; its header's claims bounded before a sample is read."""
    import soundfile

    try:
        with soundfile.SoundFile(io.BytesIO(bytes(raw))) as audio:
            if audio.format not in FORMATS:
                raise RequestError(f"audio {index} is {audio.format}: send one of {', '.join(FORMATS)}")
            rate, frames, channels = audio.samplerate, audio.frames, audio.channels
            if frames <= 0 or channels <= 0:
                raise RequestError(f"audio {index} holds no samples")
            _check_rate(rate, index, "its header says")
            _check_duration(frames / rate, max_seconds, index)
            if frames * channels > max_seconds * MAX_SAMPLES_PER_SECOND:
                raise RequestError(
                    f"audio {index} holds {frames * channels:,} samples ({frames:,} frames x {channels} channels at "
                    f"{rate} Hz), more than max_audio_seconds={max_seconds:g} of 96 kHz stereo: send fewer channels "
                    f"or a lower rate (the model hears {target_rate} Hz mono)"
                )
            samples = _read_mono(audio, frames)
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
    return samples, rate


def _read_mono(audio: Any, frames: int) -> np.ndarray:
    """Up to `frames` frames of an open SoundFile, its channels averaged a block at a time (the same float32 means
    as averaging all of them at once: each frame's mean is its own)."""
    mono = np.empty(frames, dtype=np.float32)
    done = 0
    while done < frames:
        block = audio.read(min(BLOCK_FRAMES, frames - done), dtype="float32", always_2d=True)
        if not len(block):  # the header promised more than the file holds
            break
        mono[done : done + len(block)] = block.mean(axis=1)
        done += len(block)
    return mono[:done]


def _check_rate(rate: int, index: int, said: str) -> None:
    low, high = interface.SAMPLING_RATE_RANGE
    if not low <= rate <= high:
        raise RequestError(f"audio {index}: {said} {rate} Hz, outside {low}..{high} Hz: re-encode it at a usual rate (e.g. 16000 Hz)")


def _check_duration(seconds: float, max_seconds: float, index: int) -> None:
    if seconds > max_seconds:
        raise RequestError(f"audio {index} is {seconds:.1f} s long, more than max_audio_seconds={max_seconds:g}: send a shorter one")


def decode_audios(values: np.ndarray, target_rate: int, max_seconds: float, raw_rate: int | None = None) -> list[np.ndarray]:
    """The audios of a request (rows of the AUDIO tensor), each decoded, checked and resampled."""
    audios = [decode_audio(item, target_rate, max_seconds, index, raw_rate) for index, item in enumerate(values.reshape(-1))]
    if not audios:
        raise RequestError("request holds no audio")
    return audios
