"""automatic-speech-recognition (Whisper: `WhisperForConditionalGeneration`; CTC models: wav2vec2, HuBERT): per row
one audio (serving/audio.py decodes, bounds and resamples it to the model's rate), the answer its text as
transformers' pipeline gives it.

Answered whole by transformers' own `AutomaticSpeechRecognitionPipeline` over the model loaded here: the feature
extractor's log-mel, the model's `generate()` (the generation config's forced prompt
`<|startoftranscript|><|lang|><|task|><|notimestamps|>`, suppress_tokens and begin_suppress_tokens, as the pipeline
applies them) and the tokenizer's `_decode_asr`. Decoding is the pipeline's default: beam search with 5 beams (its
default generation config, "as openai's whisper"), unless the model's generation config names its own num_beams.
Long audio as the pipeline does by default (no chunk_length_s): Whisper's sequential long-form generation over 30 s
windows, each next one starting at the last timestamp predicted.
The audios of a Triton batch that fit one window (<= 30 s) share one generate() call; each longer one is its own.
With word timestamps only audios of one length share a call: the alignment's DTW takes another path (other times)
when a batch's lengths differ.

A CTC model (`*ForCTC`) goes through the same pipeline: one forward pass per audio, the argmax's tokens joined by the
CTC tokenizer (no language, task or timestamps); an audio shorter than its convolutions' receptive field is refused.
backend onnx: the same pipeline over optimum's export run by ONNX Runtime (ORTModelForSpeechSeq2Seq / ORTModelForCTC:
runtimes/onnxruntime.py `speech_model`), so the answer path (generate(), _decode_asr) is still the pipeline's.
tensorrt: refused by the config.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np

from .. import interface
from ..audio import decode_audios
from ..batching.whisper import Job, WhisperBatcher
from ..inputs import RequestError
from ..runtimes import RuntimeSpec, load_runtime
from .base import media_torch


class SpeechEngine:
    """Saved model + feature extractor + tokenizer on one device, run through transformers' ASR pipeline."""

    outputs = (interface.TEXT_OUTPUT, interface.CHUNKS, interface.WORDS, interface.DURATION, interface.SPOKEN_LANGUAGE)

    def __init__(
        self,
        model_dir: str,
        device: str = "cpu",
        dtype: str = "auto",
        num_threads: int = 0,
        backend: str = "python",
        onnx_dir: str = "",
        max_audio_seconds: float = interface.DEFAULTS.max_audio_seconds,
        chunk_length_s: float = 0.0,
        **_: Any,
    ):
        import transformers

        self.torch = media_torch("automatic-speech-recognition is", backend, device, num_threads)
        self.device = device
        self.max_audio_seconds = max_audio_seconds
        self.chunk_length_s = chunk_length_s  # > 0: the pipeline's chunking (every audio's chunks batched together)
        # loaded as the pipeline loads them (AutoProcessor would give the slow WhisperTokenizer, which decodes otherwise)
        self.feature_extractor = transformers.AutoFeatureExtractor.from_pretrained(model_dir)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.rate = int(self.feature_extractor.sampling_rate)
        auto_class = interface.auto_class(interface.SPEECH_RECOGNITION, model_dir)  # Whisper (seq2seq) or a CTC model
        self.ctc = auto_class == interface.CTC_AUTO_CLASS
        spec = RuntimeSpec(
            model_dir=model_dir, onnx_dir=onnx_dir, device=device, dtype=dtype, num_threads=num_threads, auto_class=auto_class
        )
        self.model = load_runtime(backend, spec)
        self.min_samples = ctc_min_samples(self.model.config) if self.ctc else 1  # (Whisper pads every audio to 30 s)
        self.pipeline = transformers.pipeline(
            interface.SPEECH_RECOGNITION,
            model=self.model,
            tokenizer=self.tokenizer,
            feature_extractor=self.feature_extractor,
            device=device,
        )
        generation = getattr(self.model, "generation_config", None)
        self.languages = dict(getattr(generation, "lang_to_id", None) or {})  # "<|en|>" -> id
        self.multilingual = bool(getattr(generation, "is_multilingual", bool(self.languages))) and bool(self.languages)
        # word timestamps come from these cross-attention heads (openai/whisper-* checkpoints name them); optimum's
        # ONNX decoder returns no attentions
        self.word_timestamps = bool(getattr(generation, "alignment_heads", None)) and backend == "python"
        # Whisper's generate() refuses a prompt of more than half the decoder's positions
        self.max_prompt_tokens = int(getattr(self.model.config, "max_target_positions", 448)) // 2 - 1
        self.batcher = None  # serving: the decoding steps shared across requests (start_batcher)
        self.codes = {token_id: token.strip("<|>") for token, token_id in self.languages.items()}  # 50259 -> "en"
        self.detected = threading.local()  # per thread: the language ids generate() detected (its detect_language calls)
        detect = getattr(self.model, "detect_language", None)
        if detect is not None and self.multilingual:

            def recording(*args: Any, **kwargs: Any):
                ids = detect(*args, **kwargs)
                self.detected.__dict__.setdefault("ids", []).extend(ids.reshape(-1).tolist())
                return ids

            self.model.detect_language = recording  # generate() calls self.detect_language: the instance's first

    # ------------------------------------------------------------------ continuous batching (served Whisper on torch)

    def steps_options(
        self, audios: list[np.ndarray], language: str = "", task: str = "", return_timestamps: bool = False,
        word_timestamps: bool = False, prompt: str = "", temperature: float = 0.0, **_: Any,
    ) -> dict[str, Any] | None:  # fmt: skip
        """generate()'s options when the running batch can decode these audios (Whisper on torch, each audio one 30 s
        window, plain text asked, beam search without temperature fallback: the pipeline's default); None: generate() answers
        them whole (timestamps, a prompt, sampling, long-form or chunked audio, a CTC model, ONNX Runtime)."""
        config = self.pipeline.generation_config  # what generate() is given (the model's, the pipeline's defaults in)
        if self.batcher is None or self.chunk_length_s or return_timestamps or word_timestamps or prompt or temperature > 0:
            return None
        if config.num_beams < 2:  # the batcher runs generate()'s beam search only
            return None
        if getattr(config, "condition_on_prev_tokens", None):  # a next segment would start from the previous one's text
            return None
        thresholds = ("compression_ratio_threshold", "logprob_threshold", "no_speech_threshold")  # the fallback's
        if isinstance(config.temperature, (list, tuple)) or any(getattr(config, name, None) is not None for name in thresholds):
            return None
        if any(len(audio) > self.feature_extractor.n_samples for audio in audios):
            return None
        return self.language_task(language, task)

    def language_task(self, language: str, task: str) -> dict[str, str]:
        """generate()'s `language` and `task` options: those asked, none on an English-only model (its generate()
        refuses both; check_options lets only language "en" and task transcribe through, which is what it does)."""
        if not self.multilingual:
            return {}
        return {key: value for key, value in (("language", language), ("task", task)) if value}

    def features(self, audio: np.ndarray) -> dict[str, Any]:
        """One audio's generate() inputs as the pipeline prepares them (log-mel features, their mask), on the device."""
        item = next(iter(self.pipeline.preprocess({"raw": audio, "sampling_rate": self.rate})))
        item = self.pipeline._ensure_tensor_on_device(item, device=self.pipeline.device)
        return {key: item[key] for key in ("input_features", "attention_mask") if key in item}

    def spoken(self, asked: str, decoded: list[int] | int | None) -> str:
        """The answer's language code: the one asked, else the language token it was decoded with (ids of the decoder
        prompt, or the detected id), else "en" for an English-only Whisper and "" for a CTC model."""
        if asked:
            return asked
        ids = [decoded] if isinstance(decoded, int) else decoded or []
        found = next((self.codes[i] for i in ids if i in self.codes), "")
        return found or ("" if self.ctc or self.multilingual else "en")

    def text(self, tokens) -> str:
        """An answer's tokens (generate()'s, prompt off) as the pipeline writes them."""
        return self.pipeline.postprocess([{"tokens": tokens[None].cpu(), "is_last": True}])["text"]

    def start_batcher(self, max_audios: int, log=print):
        """The running batch (batching/whisper.py) on a thread of its own; requests go in with `batcher.submit`."""
        if self.ctc or not isinstance(self.model, self.torch.nn.Module):
            return None
        self.batcher = WhisperBatcher(self.model, self.text, self.device, max_audios, log)
        self.batcher_thread = threading.Thread(target=self.batcher.run_forever, name="hf2triton-whisper", daemon=True)
        self.batcher_thread.start()
        log(f"hf2triton: Whisper with continuous batching (up to {max_audios} audios decoding together)")
        return self.batcher

    def text_outputs(self, texts: list[str], audios: list[np.ndarray], languages: list[str]) -> dict[str, np.ndarray]:
        """run()'s outputs for answers of plain text (no chunks or words were asked)."""
        empty = chunks_json([]).encode("utf-8")
        return {
            interface.SPOKEN_LANGUAGE: np.array([code.encode("utf-8") for code in languages], dtype=np.object_),
            interface.TEXT_OUTPUT: np.array([text.encode("utf-8") for text in texts], dtype=np.object_),
            interface.CHUNKS: np.array([empty] * len(texts), dtype=np.object_),
            interface.WORDS: np.array([empty] * len(texts), dtype=np.object_),
            interface.DURATION: np.array([len(audio) / self.rate for audio in audios], dtype=np.float32),
        }

    def stop_batcher(self, timeout_s: float = 10.0) -> None:
        """End the running batch: what it holds is answered with an error, then its thread ends."""
        if self.batcher is not None:
            self.batcher.stop()
            self.batcher_thread.join(timeout_s)

    def transcribe(self, audios: list[np.ndarray], generate: dict[str, Any], done, cancelled=lambda: False) -> None:
        """Hand audios to the running batch; `done(texts, prompts, error)` is called on its thread when all are decoded
        (prompts: each answer's decoder prompt ids, whose language token `spoken` reads)."""
        options = {"generation_config": self.pipeline.generation_config, **generate}
        self.batcher.submit(Job([self.features(audio) for audio in audios], options, done, cancelled))

    def decode(self, values: np.ndarray, raw_rate: int | None = None) -> list[np.ndarray]:
        """A request's AUDIO rows as mono float32 samples at the model's rate (RequestError: that request's own,
        an audio too short for a CTC model's convolutions too: the forward pass would fail its whole batch)."""
        audios = decode_audios(values, self.rate, self.max_audio_seconds, raw_rate)
        for index, audio in enumerate(audios):
            if len(audio) < self.min_samples:
                raise RequestError(
                    f"audio {index} is {len(audio)} samples ({1000 * len(audio) / self.rate:.1f} ms at {self.rate} Hz); "
                    f"this model needs at least {self.min_samples} ({1000 * self.min_samples / self.rate:.1f} ms): "
                    "send a longer one"
                )
        return audios

    def check_options(
        self, language: str = "", task: str = "", return_timestamps: bool = False, word_timestamps: bool = False,
        prompt: str = "", temperature: float = 0.0, **_: Any,
    ) -> None:  # fmt: skip
        """Raise RequestError for a language this model does not know, or a language other than English / translation
        on an English-only one, word timestamps on a model without alignment heads, a prompt that is not text or too
        long; on a CTC model any of these options. A message opens with the option it refuses (the gateway names
        the form field from it)."""
        values = (language, task, return_timestamps, word_timestamps, prompt, temperature)
        sent = [f"'{name}'" for name, value in zip(interface.SPEECH_OPTION_NAMES, values) if value]
        if self.ctc and sent:
            names = ", ".join(f"'{name}'" for name in interface.SPEECH_OPTION_NAMES)
            raise RequestError(
                f"{', '.join(sent)}: this is a CTC model (no decoder: no language detection, translation or "
                f"timestamps): it takes none of {names}"
            )
        if not self.multilingual:  # OpenAI clients send language "en" routinely: what this model does anyway
            if task == "translate":
                raise RequestError(f"{interface.SPEECH_TASK}='translate': this model is English-only: it only transcribes English")
            if language not in ("", "en"):
                raise RequestError(
                    f"{interface.LANGUAGE}={language!r}: this model is English-only (its generation config has no "
                    "languages): send no language, or en"
                )
        elif language and f"<|{language}|>" not in self.languages:
            known = ", ".join(sorted(token.strip("<|>") for token in self.languages))
            raise RequestError(f"{interface.LANGUAGE}={language!r} is not one of this model's languages: {known}")
        if word_timestamps and not self.word_timestamps:
            raise RequestError(
                f"'{interface.WORD_TIMESTAMPS}': not served by this model: its generation config names no alignment_heads "
                "(the cross-attention heads words are timed by; openai/whisper-* checkpoints have them), or it runs on "
                "ONNX Runtime, whose exported decoder returns no attentions (backend: python serves them)"
            )
        if prompt:
            self.prompt_ids(prompt)

    def prompt_ids(self, prompt: str):
        """The decoder's prompt (<|startofprev|> + the text's tokens) as generate() takes it (RequestError: unusable)."""
        try:
            ids = self.tokenizer.get_prompt_ids(prompt, return_tensors="pt")
        except ValueError as err:  # a special token's text in the prompt
            raise RequestError(f"'{interface.SPEECH_PROMPT}': {err}") from None
        if len(ids) - 1 > self.max_prompt_tokens:
            raise RequestError(
                f"'{interface.SPEECH_PROMPT}' is {len(ids) - 1} tokens: this model takes at most {self.max_prompt_tokens} "
                "(half its decoder's positions); send a shorter one"
            )
        return ids.to(self.device)

    def run(
        self,
        audios: list[Any],
        language: str = "",
        task: str = "",
        return_timestamps: bool = False,
        word_timestamps: bool = False,
        prompt: str = "",
        temperature: float = 0.0,
        **_: Any,
    ) -> dict[str, np.ndarray]:
        """Per audio (samples at the model's rate; or encoded files: decoded here) its text, chunks, words and duration.
        `language` / `task` "": not sent to generate() (the pipeline's default: the model detects the language).
        Segments and words are two decodings (timestamp tokens change the text): both asked, two pipeline passes."""
        if audios and isinstance(audios[0], (bytes, np.bytes_)):
            audios = self.decode(np.array(audios, dtype=np.object_))
        generate: dict[str, Any] = self.language_task(language, task)
        if prompt:
            generate["prompt_ids"] = self.prompt_ids(prompt)
        if temperature > 0:  # sampled with one beam, as OpenAI's and vLLM's transcriptions
            generate.update(do_sample=True, temperature=temperature, num_beams=1)
        first = "word" if word_timestamps and not return_timestamps else return_timestamps
        answers = self._answers(audios, generate, first)
        words = answers if first == "word" else self._answers(audios, generate, "word") if word_timestamps else None

        def chunks(answer: dict[str, Any] | None, asked: bool) -> bytes:
            return chunks_json(answer.get("chunks", []) if answer and asked else []).encode("utf-8")

        return {
            interface.TEXT_OUTPUT: np.array([a["text"].encode("utf-8") for a in answers], dtype=np.object_),
            interface.CHUNKS: np.array([chunks(a, return_timestamps) for a in answers], dtype=np.object_),
            interface.WORDS: np.array([chunks(w, True) for w in words or [None] * len(audios)], dtype=np.object_),
            interface.DURATION: np.array([len(audio) / self.rate for audio in audios], dtype=np.float32),
            interface.SPOKEN_LANGUAGE: np.array([self.spoken(language, a.get("language_id")).encode() for a in answers], dtype=np.object_),
        }

    def _answers(self, audios: list[np.ndarray], generate: dict[str, Any], timestamps: bool | str) -> list[dict[str, Any]]:
        """The pipeline's answer per audio: those that fit one window in one call, each longer one alone (chunked:
        every audio in one call, its chunks batched together)."""
        options = {"generate_kwargs": generate, **({"return_timestamps": timestamps} if timestamps else {})}
        if self.chunk_length_s:  # a CTC model's chunks one audio at a time: padding a batch would change its answer;
            # words: a batch of chunks of other lengths (an audio's last one) would change their times (_word_batches)
            batch = [{"raw": audio, "sampling_rate": self.rate} for audio in audios]
            size = 1 if self.ctc or timestamps == "word" else len(batch)
            return list(self.pipeline(batch, batch_size=size, chunk_length_s=self.chunk_length_s, **options))
        answers: list[dict[str, Any] | None] = [None] * len(audios)
        # Whisper pads every window to 30 s, so windows batch exactly; a CTC model's padding would change its answer
        window = 0 if self.ctc else self.feature_extractor.n_samples
        short = [i for i, audio in enumerate(audios) if len(audio) <= window]
        for group in _word_batches(short, audios) if timestamps == "word" else [short] if short else []:
            batch = [{"raw": audios[i], "sampling_rate": self.rate} for i in group]
            self.detected.ids = []
            for i, answer in zip(group, self.pipeline(batch, batch_size=len(batch), **options)):
                answers[i] = answer
            if len(self.detected.ids) == len(group):  # one generate() for the batch: a detected language per audio
                for i, language_id in zip(group, self.detected.ids):
                    answers[i]["language_id"] = language_id
        for i, audio in enumerate(audios):
            if answers[i] is None:  # long-form: one sequential generate() of its own (a CTC model: one forward pass)
                self.detected.ids = []
                answers[i] = self.pipeline({"raw": audio, "sampling_rate": self.rate}, **options)
                answers[i]["language_id"] = self.detected.ids[0] if self.detected.ids else None
        return answers  # type: ignore[return-value]


def _word_batches(indices: list[int], audios: list[np.ndarray]) -> list[list[int]]:
    """The audios (`indices`) grouped by length: with word timestamps, transformers' _extract_token_timestamps runs
    one DTW over the batch when its frame counts are equal, one per audio when they differ, and the times differ
    between the two (27.86 s vs 27.88 s); equal lengths keep each answer the pipeline's for that audio alone."""
    groups: dict[int, list[int]] = {}
    for i in indices:
        groups.setdefault(len(audios[i]), []).append(i)
    return list(groups.values())


def ctc_min_samples(config: Any) -> int:
    """The fewest samples a CTC model's feature encoder (its conv_kernel / conv_stride layers, wav2vec2's family)
    turns into one frame: fewer and torch's conv1d fails ("Kernel size can't be greater than actual input size")."""
    length = 1
    for kernel, stride in reversed(list(zip(getattr(config, "conv_kernel", ()), getattr(config, "conv_stride", ())))):
        length = (length - 1) * stride + kernel
    return length


def chunks_json(chunks: list[dict[str, Any]]) -> str:
    """The pipeline's timestamped chunks as JSON: {timestamp: [start, end], text} (an open end: null)."""
    return json.dumps([{"timestamp": list(c["timestamp"]), "text": c["text"]} for c in chunks], ensure_ascii=False)
