"""automatic-speech-recognition at its edges, in process on the tiny Whisper and wav2vec2 built here: a file header's
rate and channels bounded before decoding (a 244-byte WAV at 4 MHz, an 8-channel 384 kHz FLAC), an odd rate's
resampling bounded, running out of memory as the request's error, the other WAV layouts (WAVE_FORMAT_EXTENSIBLE,
RF64, W64) and AIFF / CAF read, word timestamps independent of the batch's other audios, a clip too short for a CTC
model's convolutions refused per request, the gateway naming a refused timestamp as `response_format`, and language
"en" on an English-only Whisper a no-op."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile

from hf2triton.pipeline.audio_probes import encoded_audio, synthetic_audio
from hf2triton.serving import audio as audio_inputs
from hf2triton.serving import inputs, interface
from tests.media_models import build_tiny_ctc, build_tiny_whisper


@pytest.fixture(scope="module")
def whisper(tmp_path_factory) -> Path:
    return build_tiny_whisper(tmp_path_factory.mktemp("whisper") / "tiny-whisper")


@pytest.fixture(scope="module")
def ctc(tmp_path_factory):
    from hf2triton.serving.tasks.speech import SpeechEngine

    return SpeechEngine(str(build_tiny_ctc(tmp_path_factory.mktemp("ctc") / "tiny-wav2vec2")))


def written(samples: np.ndarray, rate: int, audio_format: str = "WAV", subtype: str | None = None) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=audio_format, subtype=subtype)
    return buffer.getvalue()


def test_a_headers_rate_and_channels_are_bounded_before_decoding():
    for rate in (4_000_001, 2**31 - 1):  # 244 bytes: 21 s of CPU and 3.1 GB to resample, or a MemoryError, before
        with pytest.raises(inputs.RequestError, match=rf"audio 0: its header says {rate} Hz, outside 1000..384000 Hz: re-encode"):
            audio_inputs.decode_audio(written(np.zeros(100, np.float32), rate), 16000, 600)
    with pytest.raises(inputs.RequestError, match="its sampling_rate is 500 Hz, outside 1000..384000"):
        audio_inputs.decode_audio(np.zeros(100, np.float32).tobytes(), 16000, 600, raw_rate=500)
    eight = written(np.zeros((384_000 * 2, 8), np.int16), 384_000, "FLAC")  # a few KB of silence, 24.6 M samples
    message = r"audio 0 holds 6,144,000 samples \(768,000 frames x 8 channels at 384000 Hz\), more than max_audio_seconds=30 of 96"
    with pytest.raises(inputs.RequestError, match=message):
        audio_inputs.decode_audio(eight, 16000, 30)


def test_resampling_is_exact_for_the_usual_rates_and_bounded_for_an_odd_one():
    usual = {8000: (2, 1), 11025: (640, 441), 22050: (320, 441), 24000: (2, 3), 32000: (1, 2), 44100: (160, 441), 48000: (1, 3)}
    assert {rate: audio_inputs.resample_ratio(rate, 16000) for rate in usual} == usual
    assert audio_inputs.resample_ratio(44100, 24000) == (80, 147) and audio_inputs.resample_ratio(16000, 22050) == (441, 320)
    for rate in (44101, 383987, 1001, 99991):  # a prime rate: resample_poly's filter would have 20 x rate taps
        up, down = audio_inputs.resample_ratio(rate, 16000)
        assert max(up, down) <= audio_inputs.MAX_RATIO_TERM and abs(up * rate / (down * 16000) - 1) < 5e-5, rate
    decoded = audio_inputs.decode_audio(written(synthetic_audio(1.0, 383987), 383987), 16000, 60)
    assert abs(len(decoded) - 16000) <= 2


def test_channels_are_averaged_a_block_at_a_time_and_memory_is_the_requests_error(monkeypatch):
    stereo = np.stack([synthetic_audio(2.0, 44100), synthetic_audio(2.0, 44100, 1)], axis=1)
    whole = audio_inputs.decode_audio(written(stereo, 44100, "FLAC"), 16000, 60)
    monkeypatch.setattr(audio_inputs, "BLOCK_FRAMES", 1000)  # 89 blocks: the same means as all frames at once
    with soundfile.SoundFile(io.BytesIO(written(stereo, 44100, "FLAC"))) as file:
        expected = file.read(dtype="float32").mean(axis=1)
    assert np.array_equal(audio_inputs.decode_audio(written(stereo, 44100, "FLAC"), 16000, 60), whole)
    assert np.array_equal(audio_inputs.resample(expected, 44100, 16000), whole)

    def exhausted(*_):
        raise MemoryError

    monkeypatch.setattr(audio_inputs, "resample", exhausted)
    with pytest.raises(inputs.RequestError, match=r"audio 3 \(\d+ bytes\): the server ran out of memory decoding it"):
        audio_inputs.decode_audio(written(stereo, 44100), 16000, 60, index=3)


@pytest.mark.parametrize("layout", ["WAVEX", "RF64", "W64", "AIFF", "CAF"])
def test_other_wav_layouts_and_aiff_caf_are_read(layout):
    """WAVEX: WAV in WAVE_FORMAT_EXTENSIBLE layout, what ffmpeg writes for > 16 bits, > 48 kHz or > 2 channels."""
    samples = np.stack([synthetic_audio(1.0, 48000), synthetic_audio(1.0, 48000, 1)], axis=1)
    expected = audio_inputs.decode_audio(written(samples, 48000, "WAV", "PCM_24"), 16000, 60)
    assert np.array_equal(audio_inputs.decode_audio(written(samples, 48000, layout, "PCM_24"), 16000, 60), expected)


def test_word_timestamps_do_not_depend_on_the_batchs_other_audios(whisper):
    """transformers' _extract_token_timestamps takes another path when a batch's audios differ in length: each
    audio's words equal the pipeline's for it alone; audios of one length still share a pass."""
    from transformers import pipeline

    from hf2triton.serving.tasks.speech import SpeechEngine

    engine = SpeechEngine(str(whisper))
    rng = np.random.default_rng(1)
    audios = [(rng.standard_normal(int(16000 * s)) * 0.1).astype(np.float32) for s in (1.3, 7.9, 7.9)]
    recognizer = pipeline(interface.SPEECH_RECOGNITION, model=str(whisper))
    alone = [recognizer({"raw": audio, "sampling_rate": 16000}, return_timestamps="word") for audio in audios]
    worded = engine.run(audios, word_timestamps=True)
    assert [json.loads(words) for words in worded[interface.WORDS]] == [
        [{"timestamp": list(c["timestamp"]), "text": c["text"]} for c in answer["chunks"]] for answer in alone
    ]
    assert [text.decode() for text in worded[interface.TEXT_OUTPUT]] == [answer["text"] for answer in alone]
    audios = [audios[0], (rng.standard_normal(16000 * 25) * 0.1).astype(np.float32)]  # chunked: an audio's last chunk is shorter
    alone = [recognizer({"raw": audio, "sampling_rate": 16000}, chunk_length_s=10, return_timestamps="word") for audio in audios]
    worded = SpeechEngine(str(whisper), chunk_length_s=10).run(audios, word_timestamps=True)
    assert [json.loads(words) for words in worded[interface.WORDS]] == [
        [{"timestamp": list(c["timestamp"]), "text": c["text"]} for c in answer["chunks"]] for answer in alone
    ]


def test_a_clip_too_short_for_a_ctc_models_convolutions_is_refused_per_request(ctc):
    clip = lambda n: np.array([written(np.full(n, 0.1, np.float32), 16000)], dtype=np.object_)  # noqa: E731
    for n in (1, 44):  # before: conv1d's RuntimeError, a 500 for every request of the Triton batch
        with pytest.raises(inputs.RequestError, match=rf"audio 0 is {n} samples \([\d.]+ ms at 16000 Hz\); this model needs at least 45"):
            ctc.decode(clip(n))
    assert ctc.run(ctc.decode(clip(45)))[interface.DURATION].tolist() == pytest.approx([45 / 16000])  # kernels 10, 8; strides 5, 4
    from transformers import Wav2Vec2Config

    from hf2triton.serving.tasks.speech import ctc_min_samples

    assert ctc_min_samples(Wav2Vec2Config()) == 400  # wav2vec2-base's receptive field: 25 ms at 16 kHz


def test_the_gateway_names_a_refused_timestamp_as_response_format(ctc, whisper):
    from hf2triton.gateway.api.audio import GRANULARITY, name_refusal, speech_options
    from hf2triton.gateway.errors import ApiError
    from hf2triton.serving.tasks.speech import SpeechEngine

    def refusal(engine, fields: dict[str, str], task: str = "transcribe") -> ApiError:
        with pytest.raises(inputs.RequestError) as refused:
            engine.check_options(**speech_options(fields, task)[1])
        err = ApiError(400, str(refused.value))
        name_refusal(err, fields.get("response_format", "json"))
        return err

    for response_format in ("verbose_json", "srt", "vtt"):  # before: param "language", which was never sent
        err = refusal(ctc, {"response_format": response_format})
        assert err.param == "response_format", err.message
        assert err.message.startswith(
            f"response_format={response_format!r} needs timestamps, which this model does not give: use json or text"
        )
    assert refusal(ctc, {"response_format": "verbose_json", GRANULARITY: "word"}).param == GRANULARITY  # words only
    assert refusal(ctc, {"language": "de"}).param == "language"
    assert refusal(ctc, {"temperature": "0.5"}).param == "temperature"
    multilingual = SpeechEngine(str(whisper))
    assert refusal(multilingual, {"language": "xx"}).param == "language"
    assert refusal(multilingual, {"prompt": "<|endoftext|>"}).param == "prompt"


def test_language_en_on_an_english_only_whisper_is_a_no_op(whisper, tmp_path):
    from hf2triton.serving.tasks.speech import SpeechEngine

    english = tmp_path / "tiny-whisper.en"
    shutil.copytree(whisper, english)
    config = json.loads((english / "generation_config.json").read_text())
    (english / "generation_config.json").write_text(json.dumps({**config, "is_multilingual": False}))
    engine = SpeechEngine(str(english))
    audios = [encoded_audio(synthetic_audio(2.0, 16000), 16000, "WAV")]
    plain = engine.run(audios)
    for language in ("en", inputs.speech_options(np.array([[b"English"]], dtype=np.object_), None, None)[interface.LANGUAGE]):
        engine.check_options(language=language, task="transcribe")  # OpenAI clients send language "en" routinely
        asked = engine.run(audios, language=language, task="transcribe")  # before: generate()'s ValueError
        assert asked[interface.TEXT_OUTPUT].tolist() == plain[interface.TEXT_OUTPUT].tolist()
        assert asked[interface.SPOKEN_LANGUAGE].tolist() == plain[interface.SPOKEN_LANGUAGE].tolist() == [b"en"]
    with pytest.raises(inputs.RequestError, match="language='de': this model is English-only .*send no language, or en"):
        engine.check_options(language="de")
    with pytest.raises(inputs.RequestError, match="task='translate': this model is English-only"):
        engine.check_options(task="translate")
