"""Triton Python-backend model rendered by hf2triton (copied verbatim to <repository>/<name>/1/model.py, with the
serving modules the model uses beside it, at their paths in this package).

Everything model-specific comes from the `parameters` of config.pbtxt (task, saved-model directory,
dtype, threads, limits, generation defaults), so this one file serves every task. It is the Triton side only:

- `initialize` builds the model's engine once, on the instance's device (hf2triton.serving.tasks: the task's
  head over its backend's runtime).
- `execute` decodes every request (inputs.py), answers bad ones (invalid UTF-8, empty, too long, bad options)
  with an error response of their own, and runs all good texts of the call through ONE forward pass
  (generation: one pass per distinct set of generation options), then splits the results per request.
  A streaming generation model instead hands each checked request to its batcher: the torch continuous
  batcher (batching/) or, for backend vllm, vLLM's engine (runtimes/vllm.py).

The engines are plain Python, importable without Triton: hf2triton's validation runs them in-process as the
reference the served outputs must match.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import threading
import time
from typing import Any

import numpy as np

try:  # only present inside the Triton Python-backend stub
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover - imported by tests and by the in-process reference
    pb_utils = None

RENDERED_PACKAGE = "hf2triton_serving"  # the package the copies beside a rendered model.py are imported as


def _package() -> str:
    """The package the serving modules come from: the package's own when this is hf2triton.serving.model; else
    this file's directory, the copies rendered next to it, made the package `hf2triton_serving` (Triton loads
    model.py by path, in a Python where hf2triton need not be installed). The modules import each other
    relatively, so they work unchanged in both."""
    if __name__ == "hf2triton.serving.model":
        return "hf2triton.serving"
    if RENDERED_PACKAGE not in sys.modules:
        spec = importlib.machinery.ModuleSpec(RENDERED_PACKAGE, None, is_package=True)
        spec.submodule_search_locations = [os.path.dirname(os.path.abspath(__file__))]
        sys.modules[RENDERED_PACKAGE] = importlib.util.module_from_spec(spec)
    return RENDERED_PACKAGE


def _load_sibling(name: str):
    """A serving module by its name in the package: "inputs", "tasks", "batching.slots" ..."""
    return importlib.import_module(f"{_package()}.{name}")


interface = _load_sibling("interface")
inputs = _load_sibling("inputs")
sequences = _load_sibling("batching.sequences")
tasks = _load_sibling("tasks")
ModelParameters = interface.ModelParameters


def is_cancelled(request) -> bool:
    check = getattr(request, "is_cancelled", None)  # python_backend >= 23.10
    return bool(check and check())


def wants_keepalive(request) -> bool:
    """The request asks for interface.KEEPALIVE (a request parameter: Triton's generate_stream body's "parameters")."""
    reader = getattr(request, "parameters", None)  # python_backend >= 23.xx: the parameters as JSON text
    try:
        return bool(reader and json.loads(reader() or "{}").get(interface.KEEPALIVE))
    except (ValueError, AttributeError):
        return False


class KeepAlive:
    """`cancelled` for a request that asked for interface.KEEPALIVE: before answering, an empty piece when KEEPALIVE_S
    passed and nothing was sent yet (a request waiting for a place). The batchers ask while holding the request as a
    send does (sequences.ask_if_gone), so this never overlaps its pieces; `started()` (its first piece) ends it."""

    def __init__(self, sender, gone):
        self.sender, self.gone = sender, gone
        self.due = time.monotonic() + interface.KEEPALIVE_S
        self.answering = False
        self.lock = threading.Lock()  # a queue-full purge may ask from Triton's thread while the response thread does

    def started(self) -> None:
        if not self.answering:
            with self.lock:
                self.answering = True

    def __call__(self) -> bool:
        if not self.answering and time.monotonic() >= self.due and self.lock.acquire(blocking=False):
            try:
                if not self.answering:
                    self.due = time.monotonic() + interface.KEEPALIVE_S
                    self.sender.send(pb_utils.InferenceResponse(output_tensors=[_bytes(interface.TEXT_OUTPUT, "")]))
            finally:
                self.lock.release()
        return self.gone()


def cancelled_response():
    return error_response("request cancelled", "CANCELLED")


def error_response(message: str, kind: str = "INVALID_ARG"):
    """An error response for one request: the request's mistake (400-class, INVALID_ARG), or with kind INTERNAL the
    server's own failure (its message then starts with interface.INTERNAL_ERROR), UNAVAILABLE or CANCELLED, each with
    its code where the backend supports codes."""
    if kind == "INTERNAL" and not message.startswith(interface.INTERNAL_ERROR):
        message = interface.INTERNAL_ERROR + message
    code = getattr(getattr(pb_utils, "TritonError", None), kind, None)
    error = pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


def _bytes(name: str, text: str):
    return pb_utils.Tensor(name, np.array([text.encode("utf-8")], dtype=np.object_))


def _rows(values: np.ndarray) -> np.ndarray:
    """Shape outputs as [texts, ...]: strings and scalars get a trailing dim of 1 (config dims [1])."""
    return values.reshape(-1, 1) if values.ndim == 1 else values


class TritonPythonModel:
    """The Triton entry point."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        version_dir = os.path.join(args.get("model_repository", ""), args.get("model_version", ""))
        self.params = ModelParameters.from_strings({k: v["string_value"] for k, v in config.get("parameters", {}).items()}).located(
            version_dir
        )
        gpu = args.get("model_instance_kind") == "GPU"
        device = f"cuda:{args.get('model_instance_device_id', '0')}" if gpu else "cpu"
        started = time.monotonic()
        if gpu and self.params.task == interface.SPEECH_RECOGNITION and self.params.continuous_batching:
            # Whisper's running batch grows and shrinks its caches by the audio (~110 MB of cross-attention cache per
            # beam row for small's shape in float32): with fixed-size segments the allocator's reserved, unused memory
            # reached 18.7 GB and an H100 ran out at 32 audios; expandable segments did not (read at CUDA's first use)
            os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        vllm = self.params.backend == "vllm"
        # the one choice of engine (`instance`: which of a vllm model's frontends this instance is)
        self.engine = tasks.engine_from_parameters(self.params, device, serving=True, log=self._log, instance=args)
        self.task = self.params.task
        self.max_bytes = self.params.max_input_bytes
        self.defaults = {interface.MAX_NEW_TOKENS: self.params.max_new_tokens, interface.TEMPERATURE: self.params.temperature}
        self.batcher = self.engine.batcher if vllm else None  # vLLM's engine schedules itself
        self.responder = None  # the torch batcher's response thread (_start_batcher)
        if hasattr(self.engine, "describe_settings"):  # text2text: the checkpoint's generation config it follows
            self._log(f"hf2triton: {self.engine.describe_settings()}")
            cap = self.engine.checkpoint_max_new_tokens()
            if cap:  # the checkpoint's answer length, as the pipeline's (within the per-request cap)
                self.defaults[interface.MAX_NEW_TOKENS] = min(cap, self.params.max_new_tokens_limit)
        # an open-ended request's answer length (OPEN_ENDED): the per-request cap; a seq2seq model's, its checkpoint's
        generation = self.task == interface.GENERATION
        self.open_ended_tokens = self.params.max_new_tokens_limit if generation else self.defaults[interface.MAX_NEW_TOKENS]
        if self.task in interface.GENERATIVE_TASKS and self.params.streaming and not vllm:
            self._start_batcher()
        # Whisper on torch: execute() hands audios to the engine's running batch and returns; each answer goes out
        # through its request's response sender (a non-decoupled model may answer so since python_backend 24.06)
        self.speech = None
        if self.task == interface.SPEECH_RECOGNITION and self.params.continuous_batching:
            self.speech = self.engine.start_batcher(max(1, int(config.get("max_batch_size") or 1)), self._log)
        self._log(f"hf2triton: loaded {self.task} model from {self.params.model_dir} on {device} in {time.monotonic() - started:.1f} s")

    @staticmethod
    def _log(message: str) -> None:
        logger = getattr(pb_utils, "Logger", None)
        if logger is not None:
            logger.log_info(message)
        else:
            print(message, flush=True)

    def _parse(self, request) -> tuple[list[Any], dict[str, Any]]:
        if self.task in interface.IMAGE_TASKS:  # decoded images (bounded in pixels before decoding) instead of texts
            return self._parse_images(request)
        if self.task == interface.SPEECH_RECOGNITION:
            return self._parse_audio(request)
        tensor = pb_utils.get_input_tensor_by_name(request, interface.TEXT)
        if tensor is None:
            raise inputs.RequestError(f"input '{interface.TEXT}' is missing")
        values = tensor.as_numpy()
        inputs.check_request_size(values, self.params)
        texts = inputs.decode_texts(values, self.max_bytes)
        options: dict[str, Any] = {}
        if self.task in interface.GENERATIVE_TASKS:
            raw = {}
            for name in (interface.MAX_NEW_TOKENS, interface.TEMPERATURE):
                optional = pb_utils.get_input_tensor_by_name(request, name)
                raw[name] = optional.as_numpy() if optional is not None else None
            options = inputs.generation_options(raw, self.defaults)
            self.engine.check_lengths(texts, options[interface.MAX_NEW_TOKENS])
        elif self.task == interface.TOKEN_CLASSIFICATION:  # requests with the same strategy share one pass
            raw_strategy, raw_stride = self._optional(request, interface.AGGREGATION_STRATEGY), self._optional(request, interface.STRIDE)
            options = inputs.token_classification_options(raw_strategy, raw_stride, self.params.stride)
            self.engine.check_options(**options)
        elif self.task == interface.FILL_MASK:  # exactly one mask token per text, else this request's own error
            options = inputs.fill_mask_options(self._optional(request, interface.TOP_K))
            self.engine.check_masks(texts)
        elif self.task == interface.TEXT_RANKING:  # requests with the same query share one pass
            options = inputs.text_ranking_options(self._optional(request, interface.QUERY), self.max_bytes)
        elif self.task == interface.FEATURE_EXTRACTION:  # requests with the same prompt share one pass
            options = inputs.embedding_options(self._optional(request, interface.PROMPT_NAME), self.engine.prompt_names)
        return texts, options

    def _parse_images(self, request) -> tuple[list[Any], dict[str, Any]]:
        """An image task's request: its options first (cheap), then its images decoded; requests with the same options
        share one pass. A zero-shot model's embedding requests: images with `embed` true, or texts."""
        images, texts = self._optional(request, interface.IMAGE), self._optional(request, interface.TEXT)
        if self.task == interface.ZERO_SHOT_IMAGE_CLASSIFICATION and texts is not None and images is None:
            inputs.check_request_size(texts, self.params)
            return inputs.decode_texts(texts, self.max_bytes), {interface.EMBED: "texts"}
        if images is None or texts is not None:
            either = f" (or '{interface.TEXT}' for text embeddings)" if self.task == interface.ZERO_SHOT_IMAGE_CLASSIFICATION else ""
            raise inputs.RequestError(f"send the encoded images in input '{interface.IMAGE}'{either}")
        inputs.check_request_size(images, self.params, "image")
        embed = self._optional(request, interface.EMBED)
        if self.task == interface.ZERO_SHOT_IMAGE_CLASSIFICATION and inputs.is_set(embed):
            return self.engine.decode(images), {interface.EMBED: "images"}
        if self.task == interface.IMAGE_CLASSIFICATION:
            raw = (self._optional(request, interface.TOP_K), self._optional(request, interface.FUNCTION_TO_APPLY))
            options = inputs.image_classification_options(*raw)
        else:
            raw = (self._optional(request, interface.CANDIDATE_LABELS), self._optional(request, interface.HYPOTHESIS_TEMPLATE))
            options = inputs.zero_shot_image_options(*raw, self.max_bytes)
            self.engine.check_labels(options[interface.CANDIDATE_LABELS], options[interface.HYPOTHESIS_TEMPLATE])
        return self.engine.decode(images), options

    def _parse_audio(self, request) -> tuple[list[Any], dict[str, Any]]:
        """A speech request: its options first (cheap), then its audio decoded and resampled (bounded in seconds
        before decoding); requests with the same language / task / timestamps / prompt share one pass."""
        audios = self._optional(request, interface.AUDIO)
        if audios is None:
            raise inputs.RequestError(f"send the audio files in input '{interface.AUDIO}'")
        inputs.check_request_size(audios, self.params, "audio")
        options = inputs.speech_options(*(self._optional(request, name) for name in interface.SPEECH_OPTION_NAMES))
        self.engine.check_options(**options)
        raw_rate = inputs.raw_sampling_rate(self._optional(request, interface.SAMPLING_RATE))
        return self.engine.decode(audios, raw_rate), options

    # ------------------------------------------------------------------ streaming generation (decoupled)

    def _start_batcher(self) -> None:
        """One continuous batcher per instance, on a background thread (vllm_backend's shape): execute()
        only parses and submits; every response goes out through the request's response sender."""
        engine = self.engine
        self.responder = _load_sibling("batching.responder").Responder(self._log, threads=self.params.response_threads or None)
        self.batcher = _load_sibling(tasks.batcher_module(self.task, self.params.backend)).new_batcher(
            engine.model,
            engine.tokenizer,
            engine.device,
            cuda_graphs=self.params.cuda_graphs,
            log=self._log,
            max_sequences=self.params.max_sequences,
            max_queue=self.params.max_queue,
            context=engine.max_length,
            max_prefill_tokens=self.params.max_prefill_tokens,
            responder=self.responder,
            **getattr(engine, "batcher_options", {}),
        )
        self.loop = threading.Thread(target=self._run_batcher, name="hf2triton-batcher", daemon=True)
        self.loop.start()

    def _run_batcher(self) -> None:
        while True:
            try:
                self.batcher.run_forever()
                return
            except Exception as err:  # noqa: BLE001 - a failed pass ends its sequences, not the loop
                message = f"{interface.INTERNAL_ERROR}generation failed: {type(err).__name__}: {err}"
                self._log(f"hf2triton: {message}")
                self.batcher.fail_all(message)

    def _optional(self, request, name: str):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return tensor.as_numpy() if tensor is not None else None

    def _submit(self, request) -> tuple | None:
        """Check a request and hand it to the batcher; (sender, prompt ids, max_new_tokens) instead for one the engine
        answers whole (a text2text checkpoint's beam search: `_answer_whole`)."""
        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            raw = {name: self._optional(request, name) for name in (interface.MAX_NEW_TOKENS, interface.TEMPERATURE)}
            by_default = raw[interface.MAX_NEW_TOKENS] is None  # generation.max_new_tokens, cut to what the context leaves
            echo = inputs.asks_prompt_logprobs(self._optional(request, interface.PROMPT_LOGPROBS))
            options = inputs.generation_options(raw, self.defaults, nothing_generated=echo)
            names = (interface.TOP_P, interface.TOP_K, interface.SEED, interface.STOP, interface.LOGPROBS, interface.PROMPT_LOGPROBS)
            names += (interface.GUIDED, interface.PRESENCE_PENALTY, interface.FREQUENCY_PENALTY, interface.IGNORE_EOS)
            raw = {name: self._optional(request, name) for name in names}
            sampling = sequences.Sampling(**inputs.sampling_values(raw, options, self.params))
            self._check_logprobs(sampling)
            names = (interface.TEXT, interface.MESSAGES, interface.PROMPT_IDS, interface.TOOLS, interface.RAW_PROMPT)
            text, messages, ids, tools, raw = (self._optional(request, name) for name in names)
            max_new_tokens = 1 if by_default else options[interface.MAX_NEW_TOKENS]  # by default: room for one at least
            prompt_ids = inputs.prompt_ids(self.engine, text, messages, self.max_bytes, max_new_tokens, ids, tools, raw)
            if by_default:  # a prompt that fits is not refused for a limit its client never sent (vLLM: what is left)
                open_ended, room = self._optional(request, interface.OPEN_ENDED), self.engine.room(len(prompt_ids))
                tokens = inputs.unasked_max_new_tokens(open_ended, sampling.max_new_tokens, self.open_ended_tokens, room)
                sampling = dataclasses.replace(sampling, max_new_tokens=tokens)
            stream_flag = self._optional(request, interface.STREAM)
            stream = bool(stream_flag.reshape(-1)[0]) if stream_flag is not None else True
        except inputs.RequestError as err:
            sender.send(error_response(str(err)), flags=final)
            return None
        if not stream and getattr(self.engine, "answers_whole", None) and self.engine.answers_whole(sampling.temperature):
            if not (sampling.stop or sampling.guided or sampling.wants_logprobs):  # those only the batcher serves
                return sender, prompt_ids, sampling.max_new_tokens
        pieces: list[str] = []
        decode = self.engine.tokenizer.decode

        def logprobs_tensors() -> list:
            if not sampling.wants_logprobs:
                return []
            return [_bytes(interface.TOKEN_LOGPROBS, sequence.take_logprobs(decode))]

        gone = getattr(sender, "is_cancelled", None) or (lambda: is_cancelled(request))  # a closed stream / connection
        keepalive = KeepAlive(sender, gone) if stream and wants_keepalive(request) else None

        def emit(text: str, finish) -> None:
            if keepalive is not None:
                keepalive.started()
            if finish is None:
                if stream:
                    sender.send(pb_utils.InferenceResponse(output_tensors=[_bytes(interface.TEXT_OUTPUT, text), *logprobs_tensors()]))
                else:
                    pieces.append(text)
                return
            if finish.reason == "error":  # never an empty message: Triton's gRPC front end drops the error then
                message = finish.message or f"{interface.INTERNAL_ERROR}generation failed; the server log says why"
                # the server's failure, or the request's own (its grammar's dead end: sequence.error)
                kind = "INTERNAL" if message.startswith(interface.INTERNAL_ERROR) else "INVALID_ARG"
                sender.send(error_response(message, kind), flags=final)
                return
            body = text if stream else "".join(pieces) + text
            tensors = [
                _bytes(interface.TEXT_OUTPUT, body),
                _bytes(interface.FINISH_REASON, finish.reason),
                pb_utils.Tensor(interface.PROMPT_TOKENS, np.array([finish.prompt_tokens], dtype=np.int32)),
                pb_utils.Tensor(interface.COMPLETION_TOKENS, np.array([finish.completion_tokens], dtype=np.int32)),
                *logprobs_tensors(),
            ]
            sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=final)

        try:
            sequence = sequences.Sequence(prompt_ids, sampling, emit, cancelled=keepalive or gone)
            self.batcher.submit(sequence)
        except inputs.RequestError as err:  # a grammar that does not compile (the torch batchers compile it here)
            sender.send(error_response(str(err)), flags=final)
        except sequences.Busy as err:
            sender.send(error_response(str(err), "UNAVAILABLE"), flags=final)

    def _answer_whole(self, whole: list[tuple]) -> None:
        """Whole answers from the engine's generate() (a text2text checkpoint's beam search, as its pipeline), one
        pass per max_new_tokens, each sent as the batcher's final response is."""
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        groups: dict[int, list[tuple]] = {}
        for item in whole:
            groups.setdefault(item[2], []).append(item)
        for max_new_tokens, members in groups.items():
            try:
                answers = self.engine.generate_ids([ids for _, ids, _ in members], max_new_tokens)
            except Exception as err:  # noqa: BLE001 - one failed pass must not take the stub down
                message = f"generation failed: {type(err).__name__}: {err}"
                self._log(f"hf2triton: {message}")
                for sender, _, _ in members:
                    sender.send(error_response(message, "INTERNAL"), flags=final)
                continue
            for (sender, prompt_ids, _), ids in zip(members, answers):
                ended = next((at for at, token in enumerate(ids) if token in self.engine.stop_ids), None)
                tokens = ids if ended is None else ids[:ended]
                tensors = [
                    _bytes(interface.TEXT_OUTPUT, self.engine.complete_text(tokens)),
                    _bytes(interface.FINISH_REASON, "length" if ended is None else "stop"),
                    pb_utils.Tensor(interface.PROMPT_TOKENS, np.array([len(prompt_ids)], dtype=np.int32)),
                    pb_utils.Tensor(interface.COMPLETION_TOKENS, np.array([len(tokens)], dtype=np.int32)),
                ]
                sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=final)

    def _check_logprobs(self, sampling) -> None:
        """A prompt's log-probabilities only from a decoder-only model's (the torch batchers and vLLM report the rest)."""
        if self.task == interface.TEXT2TEXT and sampling.prompt_logprobs:
            raise inputs.RequestError(f"'{interface.PROMPT_LOGPROBS}': an encoder-decoder model's input has no log-probabilities")

    def execute(self, requests: list) -> list | None:
        if self.batcher is not None:
            whole = [item for item in (self._submit(request) for request in requests) if item is not None]
            if whole:
                self._answer_whole(whole)
            return None
        responses: list[Any] = [None] * len(requests)
        later: set[int] = set()  # requests the running batch answers (continuous batching of speech)
        groups: dict[tuple, list[tuple[int, list[str]]]] = {}
        for index, request in enumerate(requests):
            # The client is gone (or its deadline passed). Triton's batcher drops requests cancelled while queued,
            # but without a queue policy (the default: a policy costs lone requests up to 500 ms) it prefetches the
            # next batch while the instance is busy, so a request can be cancelled after it was handed over.
            if is_cancelled(request):
                self._log("hf2triton: request cancelled by its client before compute; not computed")
                responses[index] = cancelled_response()
                continue
            try:
                texts, options = self._parse(request)
            except inputs.RequestError as err:
                responses[index] = error_response(str(err))
                continue
            if self.speech is not None and self._transcribe_in_steps(request, texts, options):
                later.add(index)
                continue
            groups.setdefault(tuple(sorted(options.items())), []).append((index, texts))
        for options, members in groups.items():
            for index, response in self._run_group(members, dict(options)):
                responses[index] = response
        if self.speech is None:
            return responses
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for index, (request, response) in enumerate(zip(requests, responses)):  # one way of answering per execute()
            if index not in later:
                request.get_response_sender().send(response, flags=final)
        return None

    def _run_group(self, members: list[tuple[int, list[Any]]], options: dict[str, Any]) -> list[tuple[int, Any]]:
        """(request index, response) for requests sharing their options: one engine pass for all of them; where that
        pass fails, each request alone, so one bad input (a text past a position table, a click-length audio) fails
        its own request only -- with INVALID_ARG where the engine named the input's mistake."""
        try:
            outputs = self.engine.run([text for _, texts in members for text in texts], **options)  # (or decoded images)
        except Exception as err:  # noqa: BLE001 - one failed pass must not take the stub down
            if len(members) > 1:
                return [answer for member in members for answer in self._run_group([member], options)]
            if isinstance(err, inputs.RequestError):
                return [(members[0][0], error_response(str(err)))]
            message = f"inference failed: {type(err).__name__}: {err}"
            self._log(f"hf2triton: {message}")
            return [(members[0][0], error_response(message, "INTERNAL"))]
        answers, start = [], 0
        for index, texts in members:
            end = start + len(texts)
            # the outputs this pass made (a zero-shot model's embedding request: not its labels)
            tensors = [pb_utils.Tensor(name, _rows(outputs[name][start:end])) for name in self.engine.outputs if name in outputs]
            answers.append((index, pb_utils.InferenceResponse(output_tensors=tensors)))
            start = end
        return answers

    def _transcribe_in_steps(self, request, audios: list[Any], options: dict[str, Any]) -> bool:
        """Hand a speech request to the running batch when it can decode it (SpeechEngine.steps_options); its answer
        goes out from the batch's thread. False: generate() answers it in this execute()."""
        generate = self.engine.steps_options(audios, **options)
        if generate is None:
            return False
        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

        def done(texts: list[str] | None, prompts: list[list[int]] | None, error: str) -> None:
            if texts is None:
                sender.send(cancelled_response() if error == "cancelled" else error_response(error, "INTERNAL"), flags=final)
                return
            languages = [self.engine.spoken(options.get(interface.LANGUAGE, ""), prompt) for prompt in prompts]
            outputs = self.engine.text_outputs(texts, audios, languages)
            tensors = [pb_utils.Tensor(name, _rows(outputs[name])) for name in self.engine.outputs]
            sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=final)

        gone = getattr(sender, "is_cancelled", None) or (lambda: is_cancelled(request))
        try:
            self.engine.transcribe(audios, generate, done, cancelled=gone)
        except Exception as err:  # noqa: BLE001 - its features failed (memory): this request's error, not the batch's
            sender.send(error_response(f"transcription failed: {type(err).__name__}: {err}", "INTERNAL"), flags=final)
        return True

    def finalize(self) -> None:
        if getattr(self, "speech", None) is not None:
            self.engine.stop_batcher()  # its thread answers what it holds, then ends, before the engine goes
        if self.batcher is not None:
            self.batcher.stop()
        if self.responder is not None:
            self.responder.stop()
        self.engine = None
