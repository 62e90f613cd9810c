"""automatic-speech-recognition (Whisper) on a tiny random Whisper built here: its tokenizer is a byte-level BPE trained
here with `tokenizers` plus Whisper's special tokens (<|startoftranscript|>, languages, tasks, <|notimestamps|>, the
1501 timestamp tokens) and a generation config with their ids -- no Whisper tokenizer files exist offline. Checked:
audio decoding (formats, resampling, the duration bound before decoding, non-audio refused), request options, config
refusals and task inference, the engine equal to transformers' own pipeline in-process (short, resampled, 45 s
long-form); and one real serve: validation PASS, tritonclient HTTP / gRPC equal the pipeline's text for a WAV and an
8 kHz FLAC, the gateway's /v1/audio/transcriptions with the openai SDK (text, json, verbose_json) and a plain multipart
post, a 20 MB file transcribed while a 20 MB JSON body and a 26 MiB form are 413, a foreign Origin (403), a non-audio
file (400 naming file); the playground's Audio view in headless Chromium (an upload, the WAV encoder, a recording from
the fake microphone)."""

from __future__ import annotations

import io
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from hf2triton.pipeline.audio_probes import encoded_audio, pipeline_speech_answers, synthetic_audio
from hf2triton.serving import audio as audio_inputs
from hf2triton.serving import inputs, interface
from hf2triton.triton import client
from tests.helpers import make_workflow, passed_checks
from tests.media_models import build_tiny_ctc, build_tiny_whisper

ASR = interface.SPEECH_RECOGNITION


@pytest.fixture(scope="module")
def whisper(tmp_path_factory) -> Path:
    return build_tiny_whisper(tmp_path_factory.mktemp("whisper") / "tiny-whisper")


def wav(seconds: float, rate: int, seed: int = 0) -> bytes:
    return encoded_audio(synthetic_audio(seconds, rate, seed), rate, "WAV")


def flac(seconds: float, rate: int, seed: int = 0) -> bytes:
    return encoded_audio(synthetic_audio(seconds, rate, seed), rate, "FLAC")


def test_audio_decoding_resamples_and_bounds_before_decoding():
    samples = audio_inputs.decode_audio(flac(2.0, 8000, 1), 16000, 60)
    assert samples.dtype == np.float32 and len(samples) == 32000
    stereo = io.BytesIO()
    import soundfile

    soundfile.write(stereo, np.stack([synthetic_audio(1.0, 16000), np.zeros(16000, np.float32)], axis=1), 16000, format="WAV")
    mono = audio_inputs.decode_audio(stereo.getvalue(), 16000, 60)
    assert np.allclose(mono, synthetic_audio(1.0, 16000) / 2, atol=1e-4)  # channels averaged (16-bit PCM)
    for compressed in ("OGG", "MP3"):  # lossy: about the same samples, at the model's rate
        decoded = audio_inputs.decode_audio(encoded_audio(synthetic_audio(1.0, 22050), 22050, compressed), 16000, 60)
        assert abs(len(decoded) - 16000) < 800 and np.abs(decoded).max() > 0.1, compressed
    raw = synthetic_audio(1.0, 8000).tobytes()
    assert len(audio_inputs.decode_audio(raw, 16000, 60, raw_rate=8000)) == 16000
    with pytest.raises(inputs.RequestError, match=r"audio 0 is 45.0 s long, more than max_audio_seconds=30"):
        audio_inputs.decode_audio(wav(45.0, 8000), 16000, 30)
    with pytest.raises(inputs.RequestError, match=r"audio 1 \(11 bytes, starting b'hello world'\) is not audio soundfile can read"):
        audio_inputs.decode_audios(np.array([[wav(1.0, 16000)], [b"hello world"]], dtype=np.object_), 16000, 60)
    with pytest.raises(inputs.RequestError, match="empty"):
        audio_inputs.decode_audio(b"", 16000, 60)
    with pytest.raises(inputs.RequestError, match="raw samples are float32"):
        audio_inputs.decode_audio(b"abc", 16000, 60, raw_rate=8000)


def test_speech_request_options():
    none = {interface.LANGUAGE: "", interface.SPEECH_TASK: "", interface.RETURN_TIMESTAMPS: False}
    none |= {interface.WORD_TIMESTAMPS: False, interface.SPEECH_PROMPT: "", interface.TEMPERATURE: 0.0}
    assert inputs.speech_options(None, None, None) == none
    text = lambda value: np.array([[value]], dtype=np.object_)  # noqa: E731
    flag = np.array([[True]])
    asked = inputs.speech_options(text(b"German"), text(b"translate"), flag, flag, text(b" Kubernetes "), np.array([[0.5]], np.float32))
    assert asked == {
        interface.LANGUAGE: "de",
        interface.SPEECH_TASK: "translate",
        interface.RETURN_TIMESTAMPS: True,
        interface.WORD_TIMESTAMPS: True,
        interface.SPEECH_PROMPT: "Kubernetes",
        interface.TEMPERATURE: 0.5,
    }
    with pytest.raises(inputs.RequestError, match="temperature=1.5 must be a finite number between 0.0 and 1.0"):
        inputs.speech_options(None, None, None, None, None, np.array([[1.5]], np.float32))
    with pytest.raises(inputs.RequestError, match="prompt of 4097 bytes exceeds"):
        inputs.speech_options(None, None, None, None, text(b"x" * 4097))
    with pytest.raises(inputs.RequestError, match="task='summarize' is not allowed: use one of transcribe, translate"):
        inputs.speech_options(None, np.array([[b"summarize"]], dtype=np.object_), None)
    with pytest.raises(inputs.RequestError, match="sampling_rate=10 must be"):
        inputs.raw_sampling_rate(np.array([[10]], dtype=np.int32))


def test_task_inference_and_config(whisper, tmp_path):
    from hf2triton.config import load_config
    from hf2triton.errors import UserError
    from hf2triton.task_inference import Evidence, infer_task

    assert infer_task(Evidence(where="d", config={"architectures": ["WhisperForConditionalGeneration"]}))[0] == ASR
    assert infer_task(Evidence(where="d", pipeline_tag=ASR, pipeline_tag_from="README.md"))[0] == ASR
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"models": [{"name": "w", "source": str(whisper), "backend": "tensorrt"}]}))
    with pytest.raises(UserError) as refused:  # backend onnx: tests/test_onnx_media.py
        load_config(path)
    assert f"not built for {ASR}" in str(refused.value) and "use backend: onnx (or python)" in refused.value.fix
    path.write_text(json.dumps({"models": [{"name": "w", "source": str(whisper), "max_audio_seconds": 90, "chunk_length_s": 10}]}))
    loaded = load_config(path)["models"][0]
    assert loaded["task"] == ASR and loaded["max_audio_seconds"] == 90 and loaded["chunk_length_s"] == 10
    path.write_text(json.dumps({"models": [{"name": "e", "source": "org/e", "task": "feature-extraction", "chunk_length_s": 10}]}))
    with pytest.raises(UserError, match=r"chunk_length_s: only for task automatic-speech-recognition \(task is feature-extraction\)"):
        load_config(path)
    path.write_text(json.dumps({"models": [{"name": "e", "source": "org/e", "task": "feature-extraction", "continuous_batching": False}]}))
    with pytest.raises(UserError, match=r"continuous_batching: only for task automatic-speech-recognition \(task is feature-extraction"):
        load_config(path)


def test_engine_equals_the_pipeline_in_process(whisper):
    from hf2triton.serving.tasks.speech import SpeechEngine

    engine = SpeechEngine(str(whisper))
    audios = [wav(3.0, 16000), flac(2.0, 8000, 1), wav(45.0, 8000, 2)]  # the last: long-form, two 30 s windows
    served = engine.run(audios)
    served_samples = engine.decode(np.array(audios, dtype=np.object_))
    reference = pipeline_speech_answers(str(whisper), audios)
    assert served[interface.TEXT_OUTPUT].tolist() == reference[interface.TEXT_OUTPUT].tolist()
    assert served[interface.DURATION].tolist() == pytest.approx([3.0, 2.0, 45.0])
    options = {"language": "de", "task": "translate"}
    translated = engine.run(audios[:2], **options)[interface.TEXT_OUTPUT].tolist()
    assert translated == pipeline_speech_answers(str(whisper), audios[:2], generate_kwargs=options)[interface.TEXT_OUTPUT].tolist()
    stamped = engine.run(audios[:1], return_timestamps=True)
    expected = pipeline_speech_answers(str(whisper), audios[:1], return_timestamps=True)
    assert stamped[interface.TEXT_OUTPUT].tolist() == expected[interface.TEXT_OUTPUT].tolist()
    assert isinstance(json.loads(stamped[interface.CHUNKS][0]), list)
    with pytest.raises(inputs.RequestError, match="language='xx' is not one of this model's languages: de, en, fr"):
        engine.check_options(language="xx")
    # the language each answer was decoded in: Whisper's own detection where none was asked (one per audio of the batch)
    detected = [engine.model.detect_language(input_features=engine.features(audio)["input_features"]).item() for audio in served_samples]
    assert served[interface.SPOKEN_LANGUAGE].tolist() == [engine.codes[i].encode() for i in detected]
    assert engine.run(audios[:2], **options)[interface.SPOKEN_LANGUAGE].tolist() == [b"de", b"de"]


@pytest.mark.parametrize("steps", ["together", "alone"])
def test_the_running_batch_equals_the_pipeline_as_audios_join_and_leave(whisper, monkeypatch, steps):
    """Continuous batching (batching/whisper.py): 7 audios of 4 requests with two sets of options, at most 3 decoding
    at once, joining while others decode, equal the pipeline one by one. The tiny model emits timestamp tokens under
    <|notimestamps|>, so generate() decodes the rest of each window as a second segment: the batch does too. A request
    whose client left ends 'cancelled' without touching the others. `together`: every search's beam step as one set
    of tensor operations (Whisper's plain-text processors); `alone`: transformers' own helpers per search, as for a
    checkpoint with other processors."""
    import threading

    from hf2triton.serving.batching import whisper as whisper_batching
    from hf2triton.serving.tasks.speech import SpeechEngine

    if steps == "alone":
        monkeypatch.setattr(whisper_batching, "_together", lambda setup: None)
    stepped, together = [], whisper_batching.WhisperBatcher._beam_steps
    monkeypatch.setattr(whisper_batching.WhisperBatcher, "_beam_steps", lambda self, *a: stepped.append(1) or together(self, *a))
    engine = SpeechEngine(str(whisper))
    assert engine.steps_options([synthetic_audio(1.0, 16000)]) is None  # no running batch yet: generate() answers
    batcher = engine.start_batcher(3, log=lambda message: None)
    resumed = []
    monkeypatch.setattr(batcher, "_resume", lambda search: resumed.append(search) or type(batcher)._resume(batcher, search))
    audios = [synthetic_audio(seconds, 16000, seed) for seed, seconds in enumerate([3.0, 2.0, 5.0, 1.0, 7.0, 2.5, 4.0])]
    asked = [{}, {"language": "de", "task": "translate"}, {}, {"language": "de", "task": "translate"}]
    parts = [audios[:2], audios[2:3], audios[3:6], audios[6:]]
    answers: dict[int, tuple] = {}
    finished = threading.Event()

    def submit(number: int, cancelled=lambda: False) -> None:
        def done(texts, prompts, error):
            answers[number] = (texts, [engine.spoken(asked[number % 4].get("language", ""), p) for p in prompts or []], error)
            if len(answers) == len(parts) + 1:
                finished.set()

        engine.transcribe(
            parts[number] if number < len(parts) else audios[:1], engine.steps_options(audios, **asked[number % 4]), done, cancelled
        )

    monkeypatch.setattr(whisper_batching, "CANCEL_POLL_S", 0.0)
    for number in range(len(parts)):
        submit(number)
    submit(len(parts), cancelled=lambda: True)
    assert finished.wait(120), answers
    batcher.stop()
    for number, part in enumerate(parts):
        alone = [engine.run([audio], **asked[number]) for audio in part]
        texts = [answer[interface.TEXT_OUTPUT][0].decode() for answer in alone]
        languages = [answer[interface.SPOKEN_LANGUAGE][0].decode() for answer in alone]  # asked, or detected by generate()
        assert answers[number] == (texts, languages, ""), number
    assert answers[len(parts)] == (None, [], "cancelled")
    assert resumed, "no audio needed a second segment: the seek loop went untested"
    assert bool(stepped) == (steps == "together")
    long_audio = synthetic_audio(31.0, 16000)
    assert engine.steps_options([long_audio]) is None and engine.steps_options(audios, return_timestamps=True) is None


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_one_cross_attention_cache_per_audio_equals_the_models_own_per_beam(whisper, implementation):
    """The running batch keeps one cross-attention cache per audio (batching/cross_attention.py): its
    beams attend as query positions of that one row, or (beams that differ) over keys indexed per row. Both equal the
    model's own cross-attention over per-beam copies of the encoder states, for eager and sdpa attention."""
    import torch
    import transformers

    from hf2triton.serving.batching import cross_attention

    model = transformers.WhisperForConditionalGeneration.from_pretrained(whisper, attn_implementation=implementation).eval()
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(3, 20, model.config.d_model, generator=generator)
    cross_attention.shared_cross_attention(model)
    with torch.inference_mode():
        cache = cross_attention.cross_cache(model, states)
        for beams in ([2, 2, 2], [1, 3, 2]):
            hidden = torch.randn(sum(beams), 4, model.config.d_model, generator=generator)
            per_beam = states.repeat_interleave(torch.tensor(beams), dim=0)
            for layer in model.get_decoder().layers:
                own, _ = layer.encoder_attn(hidden_states=hidden, key_value_states=per_beam)
                with cross_attention.attending(cache, beams):
                    shared, _ = layer.encoder_attn(hidden_states=hidden, key_value_states=per_beam)
                torch.testing.assert_close(shared, own, rtol=0, atol=1e-5)


def test_the_running_batch_answers_every_request_once_whatever_fails(whisper, monkeypatch):
    """A failed join (the encoder out of memory) answers its requests with the error, a send that fails (a closed
    connection) ends no other request, the loop goes on; unloading answers what is still held. Configurations whose
    next segment generate() would condition on the previous one stay with generate()."""
    import queue

    from hf2triton.serving.batching import whisper as whisper_batching
    from hf2triton.serving.tasks.speech import SpeechEngine

    engine = SpeechEngine(str(whisper))
    batcher = engine.start_batcher(4, log=lambda message: None)
    audio = synthetic_audio(2.0, 16000)
    options = engine.steps_options([audio])
    answers: queue.Queue = queue.Queue()
    setup, failures = whisper_batching.decoding_setup, ["CUDA out of memory"]

    def failing_once(model, kwargs):
        if failures:
            raise RuntimeError(failures.pop())
        return setup(model, kwargs)

    monkeypatch.setattr(whisper_batching, "decoding_setup", failing_once)
    engine.transcribe([audio], options, lambda texts, prompts, error: answers.put(("first", texts, error)))
    assert answers.get(timeout=60) == ("first", None, "transcription failed: RuntimeError: CUDA out of memory")

    def closed(texts, prompts, error):
        raise RuntimeError("the client's connection is closed")

    engine.transcribe([audio], options, closed)
    engine.transcribe([audio], options, lambda texts, prompts, error: answers.put(("third", texts, error)))
    label, texts, error = answers.get(timeout=60)
    assert (label, error) == ("third", "") and texts == [engine.run([audio])[interface.TEXT_OUTPUT][0].decode()]
    batcher.stopped = True  # held, not decoded: unloading answers it
    engine.transcribe([audio], options, lambda texts, prompts, error: answers.put(("held", texts, error)))
    engine.stop_batcher()
    assert answers.get(timeout=10) == ("held", None, "the model is being unloaded")
    engine.pipeline.generation_config.condition_on_prev_tokens = True
    engine.batcher = batcher
    assert engine.steps_options([audio]) is None


def test_chunked_long_audio_equals_the_pipeline_chunked(whisper):
    """chunk_length_s: every audio cut into the pipeline's overlapping chunks, the chunks of a batch decoded together,
    the answer the pipeline's with the same chunk_length_s (short and long audio in one batch, and with timestamps)."""
    from hf2triton.serving.tasks.speech import SpeechEngine

    engine = SpeechEngine(str(whisper), chunk_length_s=10)
    audios = [wav(3.0, 16000), wav(45.0, 8000, 2), flac(25.0, 8000, 1)]
    served = engine.run(audios)[interface.TEXT_OUTPUT].tolist()
    assert served == pipeline_speech_answers(str(whisper), audios, chunk_length_s=10)[interface.TEXT_OUTPUT].tolist()
    stamped = engine.run(audios[1:2], return_timestamps=True)[interface.TEXT_OUTPUT].tolist()
    reference = pipeline_speech_answers(str(whisper), audios[1:2], chunk_length_s=10, return_timestamps=True)
    assert stamped == reference[interface.TEXT_OUTPUT].tolist()


def test_engine_prompts_and_word_timestamps_equal_the_pipeline(whisper):
    """OpenAI's `prompt` (Whisper's prompt_ids) and word timestamps (the alignment heads' times), short and long-form,
    each equal to the pipeline called with the same options; both granularities at once are two decodings."""
    from hf2triton.serving.tasks.speech import SpeechEngine

    engine = SpeechEngine(str(whisper))
    audios = [wav(3.0, 16000), wav(45.0, 8000, 2)]

    from transformers import pipeline

    from hf2triton.serving.audio import decode_audio

    recognizer = pipeline(ASR, model=str(whisper))

    def reference(**options) -> list[dict]:
        return [recognizer({"raw": decode_audio(audio, 16000, 60), "sampling_rate": 16000}, **options) for audio in audios]

    prompt_ids = engine.tokenizer.get_prompt_ids("the quick brown fox", return_tensors="pt")
    prompted = engine.run(audios, prompt="the quick brown fox")
    expected = reference(generate_kwargs={"prompt_ids": prompt_ids})
    assert [t.decode() for t in prompted[interface.TEXT_OUTPUT]] == [a["text"] for a in expected]
    worded = engine.run(audios, word_timestamps=True)
    expected = reference(return_timestamps="word")
    assert [t.decode() for t in worded[interface.TEXT_OUTPUT]] == [a["text"] for a in expected]
    words = [json.loads(w) for w in worded[interface.WORDS]]
    assert words == [[{"timestamp": list(c["timestamp"]), "text": c["text"]} for c in a["chunks"]] for a in expected]
    assert words[0] and json.loads(worded[interface.CHUNKS][0]) == []
    both = engine.run(audios[:1], word_timestamps=True, return_timestamps=True)
    segments = reference(return_timestamps=True)[0]
    assert both[interface.TEXT_OUTPUT][0].decode() == segments["text"] and json.loads(both[interface.WORDS][0]) == words[0]
    assert json.loads(both[interface.CHUNKS][0]) == [{"timestamp": list(c["timestamp"]), "text": c["text"]} for c in segments["chunks"]]
    import torch

    torch.manual_seed(7)  # sampled (OpenAI's temperature): the pipeline's sampling with one beam, the same draws
    sampled = engine.run(audios[:1], temperature=0.8)[interface.TEXT_OUTPUT][0].decode()
    torch.manual_seed(7)
    sampling = {"do_sample": True, "temperature": 0.8, "num_beams": 1}
    assert sampled == recognizer({"raw": decode_audio(audios[0], 16000, 60), "sampling_rate": 16000}, generate_kwargs=sampling)["text"]
    with pytest.raises(inputs.RequestError, match="'prompt': Encountered text in the prompt corresponding to disallowed special"):
        engine.check_options(prompt="<|endoftext|>")
    with pytest.raises(inputs.RequestError, match=r"'prompt' is \d+ tokens: this model takes at most 223"):
        engine.check_options(prompt="the quick brown fox " * 100)
    engine.word_timestamps = False  # a checkpoint without alignment_heads
    with pytest.raises(inputs.RequestError, match="'word_timestamps': not served by this model: .* no alignment_heads"):
        engine.check_options(word_timestamps=True)


# ---------------------------------------------------------------- one real serve


@pytest.fixture(scope="module")
def served(tmp_path_factory, whisper):
    """The tiny Whisper served with the gateway (max_batch_size 4, max_audio_seconds 60)."""
    from hf2triton import host

    models = [{"name": "whisper", "source": str(whisper), "max_batch_size": 4, "max_audio_seconds": 60}]  # task inferred
    workflow = make_workflow(tmp_path_factory.mktemp("speech-workflow"), models)
    workflow.config["openai"] = {"enabled": True, "port": host.free_ports(1)[0]}
    workflow.run("serve")
    yield workflow
    workflow.stop()


def _infer(workflow, protocol: str, audios: list[bytes], options: dict | None = None) -> list[bytes]:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    settings = workflow.settings()
    if protocol == "http":
        module, triton = httpclient, client.http_client(settings.url("http_port"))
    else:
        module, triton = grpcclient, client.grpc_client(settings.url("grpc_port"))
    try:
        result = triton.infer("whisper", client.build_inputs(module, audios, options, primary=interface.AUDIO))
        return result.as_numpy(interface.TEXT_OUTPUT).reshape(-1).tolist()
    finally:
        triton.close()


@pytest.mark.integration
def test_served_whisper_validates_and_answers_as_the_pipeline(served, whisper):
    import tritonclient.utils

    checks = passed_checks(served, "whisper", {"http equals grpc", "served equals in-process"})
    assert checks["http inference"]["detail"].startswith("2 audios")
    assert "Whisper with continuous batching (up to 4 audios" in served.settings().log_file.read_text()
    gateway = json.loads((served.directory / "results" / "validation" / "gateway.json").read_text())
    assert gateway["ok"] and [c["name"] for c in gateway["checks"]] == ["whisper: transcription equals Triton"], gateway
    audios = [wav(3.0, 16000), flac(2.0, 8000, 1), wav(45.0, 8000, 2)]  # an 8 kHz FLAC resampled; 45 s: two windows
    reference = pipeline_speech_answers(str(whisper), audios)[interface.TEXT_OUTPUT].tolist()
    for protocol in ("http", "grpc"):
        assert _infer(served, protocol, audios) == reference
    options = {interface.LANGUAGE: "de", interface.SPEECH_TASK: "translate"}
    translated = pipeline_speech_answers(str(whisper), audios[:1], generate_kwargs={"language": "de", "task": "translate"})
    assert _infer(served, "http", audios[:1], options) == translated[interface.TEXT_OUTPUT].tolist()
    raw = {interface.SAMPLING_RATE: 8000}  # raw float32 samples instead of a file
    assert _infer(served, "grpc", [synthetic_audio(2.0, 8000, 1).tobytes()], raw) == reference[1:2]
    # 12 clients at once, each request its own audio (the running batch holds 4): every answer the pipeline's
    many = [wav(1.0 + seed / 4, 16000, seed) for seed in range(12)]
    expected = pipeline_speech_answers(str(whisper), many)[interface.TEXT_OUTPUT].tolist()
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda audio: _infer(served, "http", [audio])[0], many))
    assert answers == expected
    for bad, message in (
        ([b"not audio at all"], "audio 0 .* is not audio soundfile can read"),
        ([wav(61.0, 8000)], "more than max_audio_seconds=60"),
    ):
        with pytest.raises(tritonclient.utils.InferenceServerException, match=message):
            _infer(served, "http", bad)
    with pytest.raises(tritonclient.utils.InferenceServerException, match="language='xx' is not one of"):
        _infer(served, "http", audios[:1], {interface.LANGUAGE: "xx"})


@pytest.mark.integration
def test_gateway_transcriptions(served, whisper, tmp_path):
    import httpx
    import openai

    base = f"http://127.0.0.1:{served.config['openai']['port']}/v1"
    sdk = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
    path = tmp_path / "speech.wav"
    path.write_bytes(wav(3.0, 16000))
    expected = pipeline_speech_answers(str(whisper), [path.read_bytes()])[interface.TEXT_OUTPUT][0].decode()
    with path.open("rb") as file:
        assert sdk.audio.transcriptions.create(model="whisper", file=file).text == expected
    with path.open("rb") as file:
        assert sdk.audio.transcriptions.create(model="whisper", file=file, response_format="text").strip() == expected.strip()
    with path.open("rb") as file:
        verbose = sdk.audio.transcriptions.create(model="whisper", file=file, response_format="verbose_json")
    stamped = pipeline_speech_answers(str(whisper), [path.read_bytes()], return_timestamps=True)[interface.TEXT_OUTPUT][0].decode()
    assert verbose.text == stamped and verbose.duration == pytest.approx(3.0) and isinstance(verbose.segments, list)
    assert verbose.words is None
    assert verbose.language in ("english", "german", "french"), verbose  # the language Whisper detected, named as OpenAI does
    for kind, head in (("srt", "1\n"), ("vtt", "WEBVTT\n")):  # subtitles: one cue per segment, the segments' times
        with path.open("rb") as file:
            subtitles = sdk.audio.transcriptions.create(model="whisper", file=file, response_format=kind)
        assert subtitles.startswith(head) and subtitles.count(" --> ") == len(verbose.segments), subtitles
    with path.open("rb") as file:  # the SDK sends timestamp_granularities[] once per value
        timed = sdk.audio.transcriptions.create(
            model="whisper", file=file, response_format="verbose_json", timestamp_granularities=["word", "segment"]
        )
    assert timed.text == stamped and timed.segments is not None and timed.words, timed
    assert all(w.start <= w.end and w.word == w.word.strip() for w in timed.words)
    with path.open("rb") as file:
        prompted = sdk.audio.transcriptions.create(model="whisper", file=file, prompt="the quick brown fox")
    from transformers import AutoTokenizer

    prompt_ids = AutoTokenizer.from_pretrained(whisper).get_prompt_ids("the quick brown fox", return_tensors="pt")
    expected = pipeline_speech_answers(str(whisper), [path.read_bytes()], generate_kwargs={"prompt_ids": prompt_ids})
    assert prompted.text == expected[interface.TEXT_OUTPUT][0].decode()
    # a plain multipart post (curl -F), an 8 kHz FLAC
    audio = flac(2.0, 8000, 1)
    answer = httpx.post(f"{base}/audio/transcriptions", files={"file": ("a.flac", audio)}, data={"model": "whisper"}, timeout=60)
    assert answer.status_code == 200 and answer.json() == {
        "text": pipeline_speech_answers(str(whisper), [audio])[interface.TEXT_OUTPUT][0].decode()
    }

    # KServe V1 predict: the files base64 in JSON, options in parameters
    import base64

    files = [path.read_bytes(), audio]
    instances = [{"audio_bytes": {"b64": base64.b64encode(files[0]).decode()}}, {"b64": base64.b64encode(files[1]).decode()}]
    predicted = httpx.post(f"{base[:-3]}/v1/models/whisper:predict", json={"instances": instances}, timeout=60)
    texts = [t.decode() for t in pipeline_speech_answers(str(whisper), files)[interface.TEXT_OUTPUT]]
    assert predicted.status_code == 200 and predicted.json() == {"predictions": [{"text": t} for t in texts]}, predicted.text
    stamped = httpx.post(
        f"{base[:-3]}/v1/models/whisper:predict", json={"instances": instances[:1], "parameters": {"return_timestamps": True}}, timeout=60
    )
    assert stamped.status_code == 200 and set(stamped.json()["predictions"][0]) == {"text", "chunks"}, stamped.text
    worded = httpx.post(
        f"{base[:-3]}/v1/models/whisper:predict", json={"instances": instances[:1], "parameters": {"word_timestamps": True}}, timeout=60
    )
    assert worded.status_code == 200 and set(worded.json()["predictions"][0]) == {"text", "words"}, worded.text

    def refused(status: int, param: str | None, **kwargs) -> dict:
        reply = httpx.post(f"{base}/audio/transcriptions", timeout=60, **kwargs)
        assert reply.status_code == status, reply.text
        assert reply.json()["error"]["param"] == param, reply.json()
        return reply.json()["error"]

    form = {"files": {"file": ("a.wav", path.read_bytes())}, "data": {"model": "whisper"}}
    assert (
        "not audio soundfile can read"
        in refused(400, "file", files={"file": ("a.txt", b"hello, not audio")}, data={"model": "whisper"})["message"]
    )
    refused(400, "response_format", files=form["files"], data={"model": "whisper", "response_format": "tsv"})
    refused(400, "language", files=form["files"], data={"model": "whisper", "language": "xx"})
    refused(400, "prompt", files=form["files"], data={"model": "whisper", "prompt": "<|endoftext|>"})
    refused(400, "temperature", files=form["files"], data={"model": "whisper", "temperature": "1.5"})
    with path.open("rb") as file:  # sampled: a transcript, not the pipeline's greedy one necessarily
        assert isinstance(sdk.audio.transcriptions.create(model="whisper", file=file, temperature=0.7).text, str)
    granularity = "timestamp_granularities[]"
    assert (
        "needs response_format=verbose_json"
        in refused(400, granularity, files=form["files"], data={"model": "whisper", granularity: "word"})["message"]
    )
    refused(400, granularity, files=form["files"], data={"model": "whisper", granularity: "token", "response_format": "verbose_json"})
    # the audio endpoints take OpenAI's 25 MB files (25 MiB of form), JSON bodies stay bounded at 8 MiB
    import soundfile

    buffer = io.BytesIO()  # 20 MB of float32 stereo at 192 kHz: 13 s, one window of the model
    soundfile.write(buffer, np.stack([synthetic_audio(13.0, 192000)] * 2, axis=1), 192000, format="WAV", subtype="FLOAT")
    big = buffer.getvalue()
    assert len(big) > 19_900_000
    answer = httpx.post(f"{base}/audio/transcriptions", files={"file": ("big.wav", big)}, data={"model": "whisper"}, timeout=120)
    assert answer.status_code == 200 and isinstance(answer.json()["text"], str), answer.text
    embeddings = httpx.post(f"{base}/embeddings", content=b" " * len(big), headers={"Content-Type": "application/json"}, timeout=60)
    assert embeddings.status_code == 413 and "8 MiB (8388608 bytes) limit of a JSON body" in embeddings.json()["error"]["message"]
    too_big = refused(413, None, files={"file": ("big.wav", b"\0" * (26 << 20))}, data={"model": "whisper"})
    assert too_big["code"] == "too_large" and "25 MiB (26214400 bytes) limit of an audio upload" in too_big["message"], too_big
    foreign = refused(403, None, headers={"Origin": "https://evil.example"}, **form)
    assert foreign["code"] == "origin_not_allowed"
    assert refused(415, None, content=b"file=x", headers={"Content-Type": "text/plain"})["code"] == "unsupported_media_type"


@pytest.mark.integration
def test_the_playground_transcribes_an_uploaded_file_and_a_recording(served, tmp_path):
    """The Audio view in headless Chromium: an uploaded WAV's transcript (and with timestamps its segments) equals the
    endpoint's for the same file; the WAV encoder keeps known samples to 16 bits; a recording from Chromium's fake
    microphone is converted to a WAV the server reads, its transcript equal to the endpoint's for those bytes."""
    import base64

    import httpx
    import soundfile

    from tests.browser import FAKE_MICROPHONE, console_errors, screenshot, start_chromium, text_of, wait_for

    port = served.config["openai"]["port"]
    url = f"http://127.0.0.1:{port}/v1/audio/transcriptions"

    def endpoint(audio: bytes, name: str, **fields: str) -> dict:
        return httpx.post(url, files={"file": (name, audio)}, data={"model": "whisper", **fields}, timeout=60).json()

    def transcribe_shown(previous: str | None) -> str:
        browser.find_element("id", "audio-send").click()
        wait_for(browser, lambda: text_of(browser, "#audio-stats") not in (previous, "") or text_of(browser, "#error"))
        assert text_of(browser, "#error") == ""
        return text_of(browser, "#audio-text")

    browser = start_chromium(*FAKE_MICROPHONE)
    try:
        browser.get(f"http://127.0.0.1:{port}/playground/")
        tab = 'button[data-view="audio"]'
        wait_for(browser, lambda: browser.execute_script(f"return !document.querySelector('{tab}').hidden"))
        browser.find_element("css selector", tab).click()
        path = tmp_path / "tone.wav"
        path.write_bytes(wav(3.0, 16000, 2))
        browser.find_element("id", "audio-file").send_keys(str(path))
        wait_for(browser, lambda: browser.execute_script("return document.getElementById('audio-preview').duration > 0"))
        assert text_of(browser, "#audio-note") == f"tone.wav, {len(path.read_bytes())} bytes", "a WAV is sent as it is"
        assert transcribe_shown(None) == endpoint(path.read_bytes(), "tone.wav")["text"]
        stats = text_of(browser, "#audio-stats")
        assert stats.startswith("tone.wav · 3.00 s of audio · transcribed in ") and stats.endswith(" ms"), stats
        browser.find_element("id", "audio-timestamps").click()
        verbose = endpoint(path.read_bytes(), "tone.wav", response_format="verbose_json")
        assert transcribe_shown(stats) == verbose["text"]
        shown = browser.execute_script("return [...document.querySelectorAll('#audio-segments .segment')].map((n) => n.textContent)")
        assert shown == [segment["text"] for segment in verbose["segments"]]
        screenshot(browser, "audio", tmp_path)

        # the WAV encoder on a known AudioBuffer: two channels mixed to one, 16-bit PCM
        samples = synthetic_audio(0.5, 16000, 1)
        encoded = browser.execute_async_script(
            """const [left, right, done] = arguments;
            const buffer = new AudioBuffer({ length: left.length, numberOfChannels: 2, sampleRate: 16000 });
            buffer.copyToChannel(Float32Array.from(left), 0);
            buffer.copyToChannel(Float32Array.from(right), 1);
            const reader = new FileReader();
            reader.onload = () => done(String(reader.result).split(",")[1]);
            reader.readAsDataURL(wavOf(buffer));""",
            (samples * 0.5).tolist(),
            (samples * 1.5).tolist(),
        )
        decoded, rate = soundfile.read(io.BytesIO(base64.b64decode(encoded)), dtype="float32")
        info = soundfile.info(io.BytesIO(base64.b64decode(encoded)))
        assert (rate, info.channels, info.subtype, len(decoded)) == (16000, 1, "PCM_16", len(samples))
        assert np.abs(decoded - samples).max() <= 1.5 / 32767, "the channels' mean, to one 16-bit step"

        # a recording from the fake microphone (a beep), converted to WAV in the browser
        browser.find_element("id", "audio-timestamps").click()
        browser.find_element("id", "audio-record").click()
        wait_for(browser, lambda: text_of(browser, "#audio-note") == "recording…")
        browser.execute_script("return new Promise((done) => setTimeout(done, 1500))")
        browser.find_element("id", "audio-record").click()
        wait_for(browser, lambda: (text_of(browser, "#audio-note") or "").startswith("recording.wav, "))
        assert "converted to WAV here" in text_of(browser, "#audio-note")
        recorded = base64.b64decode(
            browser.execute_async_script(
                """const done = arguments[0];
                const reader = new FileReader();
                reader.onload = () => done(String(reader.result).split(",")[1]);
                reader.readAsDataURL(pickedAudio);"""
            )
        )
        info = soundfile.info(io.BytesIO(recorded))
        assert info.format == "WAV" and info.subtype == "PCM_16" and info.samplerate == 16000 and 1.0 < info.duration < 3.0, info
        assert transcribe_shown(text_of(browser, "#audio-stats")) == endpoint(recorded, "recording.wav")["text"]
        assert text_of(browser, "#error") == "" and not console_errors(browser), console_errors(browser)
    finally:
        browser.quit()


@pytest.mark.integration
def test_cli_infer_audio_files(served, whisper, tmp_path):
    import os
    import subprocess
    import sys

    from tests.helpers import ROOT

    files = [tmp_path / "a.wav", tmp_path / "b.flac"]
    files[0].write_bytes(wav(3.0, 16000))
    files[1].write_bytes(flac(2.0, 8000, 1))
    expected = [t.decode() for t in pipeline_speech_answers(str(whisper), [f.read_bytes() for f in files])[interface.TEXT_OUTPUT]]
    command = [sys.executable, "-m", "hf2triton", "infer", "--grpc", served.settings().url("grpc_port"), "whisper", *map(str, files)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF2TRITON_CONFIG": ""}
    run = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert run.returncode == 0 and json.loads(run.stdout) == {"texts": expected}, run.stderr
    wrong = subprocess.run([*command, "--language", "xx"], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert wrong.returncode != 0 and "language='xx' is not one of this model's languages" in wrong.stderr
    worded = subprocess.run(
        [*command[:-1], "--word-timestamps", "--json"], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert worded.returncode == 0 and set(json.loads(worded.stdout)) == {"texts", "words"}, worded.stderr
    assert "Traceback" not in wrong.stderr


@pytest.mark.integration
def test_transcription_bench_reads_the_gateway(served, whisper, tmp_path):
    """benchmarks/gpu/transcription_bench.py (issue 45's `vllm serve` anchor, the same load on both): closed loops of
    multipart posts to the gateway's /v1/audio/transcriptions, every answer the pipeline's text for that WAV."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    expected = pipeline_speech_answers(str(whisper), [encoded_audio(synthetic_audio(2.0, 16000), 16000, "WAV")])
    out = tmp_path / "transcription.json"
    target = f"gateway=http://127.0.0.1:{served.config['openai']['port']},whisper"
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu" / "transcription_bench.py"), "--target", target]
    command += ["--clients", "1", "3", "--seconds", "2", "--audio-s", "2", "--out", str(out)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    cells = json.loads(out.read_text())["cells"]
    assert [c["clients"] for c in cells] == [1, 3] and all(c["answers"] > 0 and c["errors"] == 0 for c in cells), cells
    assert all(c["distinct_texts"] == [expected[interface.TEXT_OUTPUT][0].decode()] for c in cells), (cells, expected)


def test_rendered_interface(whisper, tmp_path):
    from tritonclient.grpc import model_config_pb2 as mc

    from hf2triton.pipeline.render import render_model, serving_files
    from hf2triton.specs import ModelSpec, serving_values
    from hf2triton.triton.modelconfig import read_model_config

    spec = ModelSpec(name="w", source=str(whisper), task=ASR, max_audio_seconds=90)
    serving = serving_values(spec, gpu_available=False, cpus=2)
    files = {str(p).split("serving/")[-1] for p in serving_files(serving)}
    assert {"tasks/speech.py", "audio.py"} <= files and "images.py" not in files and "runtimes/onnxruntime.py" not in files
    config = read_model_config(render_model(str(tmp_path / "w"), serving, str(whisper)) / "config.pbtxt")
    inputs_ = [("audio", "TYPE_STRING", False), ("sampling_rate", "TYPE_INT32", True), ("language", "TYPE_STRING", True)]
    inputs_ += [("task", "TYPE_STRING", True), ("return_timestamps", "TYPE_BOOL", True), ("word_timestamps", "TYPE_BOOL", True)]
    inputs_ += [("prompt", "TYPE_STRING", True), ("temperature", "TYPE_FP32", True)]
    assert [(t.name, mc.DataType.Name(t.data_type), t.optional) for t in config.input] == inputs_
    outputs = [("text_output", [1]), ("chunks", [1]), ("words", [1]), ("duration", [1]), ("spoken_language", [1])]
    assert [(t.name, list(t.dims)) for t in config.output] == outputs
    assert config.parameters["max_audio_seconds"].string_value == "90" and "cuda_graphs" not in config.parameters
    assert config.parameters["chunk_length_s"].string_value == "0.0" and config.parameters["continuous_batching"].string_value == "true"
    assert "batching/whisper.py" in files  # the running batch, copied with the speech model


def test_a_ctc_model_equals_the_pipeline_in_process(tmp_path):
    """wav2vec2 (Wav2Vec2ForCTC, a char-level CTC tokenizer made here): task inferred, loaded by AutoModelForCTC, each
    audio alone through the pipeline (padding would change a CTC model's answer); no language / task / timestamps."""
    from hf2triton.serving.tasks.speech import SpeechEngine
    from hf2triton.task_inference import Evidence, infer_task

    directory = build_tiny_ctc(tmp_path / "tiny-wav2vec2")
    assert infer_task(Evidence(where="d", config={"architectures": ["Wav2Vec2ForCTC"]}))[0] == ASR
    from hf2triton.pipeline.pretrained import load_source_model

    model, preprocessors = load_source_model(directory, None, ASR)  # what the pretrained step loads and saves
    assert type(model).__name__ == "Wav2Vec2ForCTC" and [type(p).__name__ for p in preprocessors] == [
        "Wav2Vec2CTCTokenizer",
        "Wav2Vec2FeatureExtractor",
    ]
    engine = SpeechEngine(str(directory))
    audios = [wav(3.0, 16000), flac(2.0, 8000, 1)]
    served = engine.run(audios)[interface.TEXT_OUTPUT].tolist()
    assert served == pipeline_speech_answers(str(directory), audios)[interface.TEXT_OUTPUT].tolist() and any(served)
    audios.append(wav(7.0, 16000, 2))  # chunked (chunk_length_s): each audio's chunks alone, as the pipeline's
    chunked = SpeechEngine(str(directory), chunk_length_s=2).run(audios)[interface.TEXT_OUTPUT].tolist()
    assert chunked == pipeline_speech_answers(str(directory), audios, chunk_length_s=2)[interface.TEXT_OUTPUT].tolist()
    with pytest.raises(inputs.RequestError, match="this is a CTC model"):
        engine.check_options(return_timestamps=True)


def test_bench_pipeline_yardstick_calls_the_speech_pipeline_again_and_again(whisper):
    """bench's in-process pipeline loop over the same audios (the speech pipeline pops the keys of the dicts it takes:
    each call gets its own)."""
    from hf2triton.perf.pipelines import media_load, pipeline_throughput

    load = media_load(interface.SPEECH_RECOGNITION)
    cells = pipeline_throughput(interface.SPEECH_RECOGNITION, str(whisper), "cpu", "auto", load, [1, 2], 0)
    assert set(cells) == {"1", "2"} and all(cell["calls"] >= 5 and cell["items_per_s"] > 0 for cell in cells.values())
