"""backend vllm: vLLM's engine generates behind the same decoupled Triton model, driven as Triton's own
vllm_backend drives it.

One asyncio loop runs on its own thread and owns vLLM's `AsyncLLM` (created inside that loop: its output handler
starts there; the model itself runs in vLLM's EngineCore process). `submit()` -- what model.py's `execute()` calls
for each request, after parsing and checking it exactly as for the torch engine -- only schedules the request's
coroutine on the loop and returns. The coroutine iterates `engine.generate(...)` with DELTA outputs and hands each
new piece of text to a response thread, which sends it through the request's `emit` (model.py builds the Triton
responses); pieces that arrive while a send is in flight go out together as one response, so a slow sender costs
fewer sends rather than a growing backlog. The response thread also asks Triton whether each client is still
there (after each send, and every POLL_S for requests still waiting for a place): a gone client's request is
aborted in the engine and ends with finish reason "cancelled". With `vllm.frontends` > 1 the model's Triton instances
share one engine, each its own client of it (vllm_frontends.py): Triton spreads the requests over their processes.

Standard library only at import: vllm is imported when the engine starts, inside the vLLM environment
(hf2triton.envs), so a CPU host never imports it. Copied next to model.py into a backend vllm model only.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import interface
from ..batching.responder import response_threads
from ..batching.sequences import Busy, Finish, TokenLogprob, add_pending, after_send, ask_if_gone, take_pending
from .vllm_frontends import Frontend, SharedEngine

POLL_S = 0.1  # how often the clients of requests that get no output (waiting for a place) are asked if they are gone
STOP_GRACE_S = 5.0  # finalize(): time for cancelled requests to send their final response

# a request vLLM's engine ended with finish reason "error" (its reason is in vLLM's log, in the server log)
ENGINE_ERROR = f"{interface.INTERNAL_ERROR}vLLM's engine ended this request with an error; the server log has vLLM's reason"

# vLLM's finish reasons (and "time", the generator's own) -> the model's (Finish: stop | length |
# cancelled | time | error)
FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "cancelled", "error": "error", "repetition": "stop", "time": "time"}


# ---------------------------------------------------------------- pure mappings (tested without vllm)


def vllm_dtype(dtype: str) -> str:
    """hf2triton's dtype: auto means float16 on a GPU (as for the torch engine), not the checkpoint's own."""
    return "float16" if dtype == "auto" else dtype


def engine_arguments(params: Any) -> dict[str, Any]:
    """AsyncEngineArgs keywords from the model's parameters (ModelParameters; max_model_len resolved by render)."""
    arguments = {
        "model": params.model_dir,
        "dtype": vllm_dtype(params.dtype),
        "gpu_memory_utilization": params.gpu_memory_utilization,
        "max_model_len": params.max_model_len,
        "max_num_seqs": params.max_num_seqs,
        "enforce_eager": params.enforce_eager,
        "load_format": params.load_format,
        "disable_log_stats": True,
    }
    if params.max_num_batched_tokens:  # 0: vLLM's default for the GPU
        arguments["max_num_batched_tokens"] = params.max_num_batched_tokens
    if not params.enable_prefix_caching:  # on: vLLM's default, not named
        arguments["enable_prefix_caching"] = False
    if params.async_scheduling:  # "": vLLM's own choice, not named
        arguments["async_scheduling"] = params.async_scheduling == "true"
    if params.quantization:  # "": the checkpoint's own
        arguments["quantization"] = params.quantization
    if params.tensor_parallel_size * params.pipeline_parallel_size > 1:  # workers in processes of their own, over NCCL
        arguments.update(
            tensor_parallel_size=params.tensor_parallel_size,
            pipeline_parallel_size=params.pipeline_parallel_size,
            distributed_executor_backend="mp",
        )
    return arguments


def visible_devices(params: Any, device: str) -> str:
    """The engine's CUDA_VISIBLE_DEVICES: the GPUs it spans (vllm_gpus, "2,3": its tensor / pipeline parallel
    workers take them in order), else the instance's GPU (vllm_backend does the same); "": leave it."""
    if params.vllm_gpus:
        return params.vllm_gpus
    return device.split(":", 1)[1] if device.startswith("cuda:") else ""


def sampling_arguments(sampling: Any) -> dict[str, Any]:
    """SamplingParams keywords (without output_kind) for a checked Sampling (hf2triton.serving.batching.sequences). The same meanings: 0 is
    greedy, top_k 0 is off; stop strings end the text before them and are not part of it."""
    return {
        "max_tokens": max(1, sampling.max_new_tokens),  # 0 (the prompt's log-probabilities only): vLLM needs >= 1, the generator drops it
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty,
        "ignore_eos": sampling.ignore_eos,
        "seed": sampling.seed,
        "stop": list(sampling.stop),
        "include_stop_str_in_output": False,
        "skip_special_tokens": True,
        **logprobs_arguments(sampling),
    }


def logprobs_arguments(sampling: Any) -> dict[str, int]:
    """SamplingParams' `logprobs` / `prompt_logprobs` (k alternatives per token) for a request that asks. vLLM reports
    them from the raw logits by default (logprobs_mode raw_logprobs), as the torch engine does."""
    arguments = {}
    if sampling.logprobs >= 0:
        arguments["logprobs"] = sampling.logprobs
    if sampling.prompt_logprobs:
        arguments["prompt_logprobs"] = max(sampling.logprobs, 0)
    return arguments


def _position(token_id: int, position: Any, top: int) -> TokenLogprob:
    """One position of vLLM's logprobs, {token id: Logprob(logprob, rank, decoded_token)} holding the `top` most likely
    (ranks 1..top) and the chosen token (whatever its rank), as the torch engine's TokenLogprob."""
    ranked = [(entry.rank, token, float(entry.logprob)) for token, entry in position.items() if entry.rank is not None]
    best = sorted(item for item in ranked if item[0] <= top)
    return TokenLogprob(token_id, float(position[token_id].logprob), tuple((token, logprob) for _, token, logprob in best[:top]))


def token_logprobs(token_ids: list[int], positions: Any, top: int) -> list[TokenLogprob]:
    """A CompletionOutput's `logprobs` (one position per token of `token_ids`: with DELTA outputs, the new ones)."""
    return [_position(token_id, position, top) for token_id, position in zip(token_ids, positions or (), strict=True)]


def prompt_token_logprobs(prompt_ids: list[int], positions: Any, top: int) -> list[TokenLogprob]:
    """A RequestOutput's `prompt_logprobs`: the first position None (nothing precedes the prompt's first token)."""
    first = [TokenLogprob(prompt_ids[0], None)] if prompt_ids else []
    return first + [_position(token_id, position, top) for token_id, position in zip(prompt_ids[1:], list(positions)[1:], strict=True)]


# interface.GUIDED's kinds -> vLLM's StructuredOutputsParams fields (vLLM compiles them with its own xgrammar)
STRUCTURED_OUTPUTS = {"json_schema": "json", "json_object": "json_object", "regex": "regex", "choice": "choice", "grammar": "grammar"}


def structured_outputs(guided: Any) -> dict[str, Any] | None:
    """StructuredOutputsParams keywords for a checked Guided (None: free decoding); json_object's value is True."""
    if guided is None:
        return None
    return {STRUCTURED_OUTPUTS[guided.kind]: True if guided.kind == "json_object" else guided.value}


def finish_reason(reason: str | None) -> str:
    return FINISH_REASONS.get(reason or "error", "error")


def completion_tokens(generated: int, reason: str | None, stop_reason: Any) -> int:
    """Tokens the answer holds: vLLM counts the end-of-sequence (or stop) token that ended it, the torch engine
    does not (a stop *string*'s tokens are part of the generated text in both)."""
    ended_by_token = reason == "stop" and not isinstance(stop_reason, str)
    return max(0, generated - 1) if ended_by_token else generated


def environment_defaults() -> dict[str, str]:
    """Environment vLLM reads at import: no usage statistics sent anywhere, the local model only, no NVLink multicast,
    its engine-core process spawned rather than forked (the stub runs Triton's IPC threads and ours: a fork copies their locks), and
    without the flashinfer package the sampler it would otherwise import at start."""
    defaults = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    # tensor parallel workers talk over NCCL: NVLink multicast (NVLS) stays off unless the environment turns it on, as
    # shared hosts ask (a program using it can take the host's GPUs out of service); vLLM's all-reduce does without it
    defaults |= {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    if importlib.util.find_spec("flashinfer") is None:
        defaults["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    return defaults


class VllmApi:
    """The few names of vllm the generator uses (a fake stands in for it in the tests)."""

    def __init__(self) -> None:
        from vllm import AsyncEngineArgs, SamplingParams, TokensPrompt
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        self._names = (AsyncEngineArgs, SamplingParams, TokensPrompt, RequestOutputKind, UsageContext, AsyncLLM)
        self.structured = StructuredOutputsParams

    def engine(self, arguments: dict[str, Any]) -> Any:
        """The engine, built inside the running loop. OPENAI_API_SERVER: the defaults `vllm serve` has (step size,
        CUDA graph sizes), so the two compare on equal terms."""
        engine_args, _, _, _, usage, async_llm = self._names
        return async_llm.from_engine_args(engine_args(**arguments), usage_context=usage.OPENAI_API_SERVER)

    def shared_engine(self, arguments: dict[str, Any], frontend: Frontend, log: Callable[[str], None]) -> SharedEngine:
        """vllm.frontends > 1: this instance's client of the engine the model's frontends share (its `llm`)."""
        return SharedEngine(self._names, arguments, frontend, log)

    def request(self, prompt_ids: list[int], sampling: Any) -> tuple[Any, Any]:
        _, sampling_params, tokens_prompt, kind, _, _ = self._names
        arguments = sampling_arguments(sampling)
        guided = structured_outputs(getattr(sampling, "guided", None))
        if guided is not None:  # a grammar vLLM cannot compile fails this request, named (ValueError at add_request)
            arguments["structured_outputs"] = self.structured(**guided)
        return tokens_prompt(prompt_token_ids=prompt_ids), sampling_params(**arguments, output_kind=kind.DELTA)


# ---------------------------------------------------------------- the generator


@dataclass(eq=False)
class _Stream:
    """One request between the loop (which adds pieces) and the response thread (which sends them)."""

    sequence: Any  # Sequence: prompt_ids, sampling, emit(text, finish), cancelled()
    request_id: str
    pieces: list[str] = field(default_factory=list)
    finish: Any = None  # Finish once the engine is done with it
    queued: bool = False  # waiting in the response queue
    first_sent: bool = False  # its first response was taken (take_pending)
    cancelled: bool = False
    task: Any = None  # its coroutine's task, once it runs on the loop


class VllmGenerator:
    """vLLM's AsyncLLM on its own loop thread behind model.py's batcher interface: `submit(Sequence)` (raises
    Busy beyond max_num_seqs running + max_queue waiting, the model's other frontends' requests counted) and `stop()`.
    `frontend`: this instance's place among several in front of one engine (vllm_frontends.py); None: its own engine."""

    def __init__(
        self,
        params: Any,
        device: str = "cuda:0",
        log: Callable[[str], None] = print,
        api: Callable[[], Any] | None = None,
        frontend: Frontend | None = None,
    ):
        for key, value in environment_defaults().items():
            os.environ.setdefault(key, value)
        visible = visible_devices(params, device)
        if visible:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
        self.params, self.log, self.api = params, log, api or VllmApi
        self.max_running, self.max_queue = params.max_num_seqs, params.max_queue
        self.lock = threading.Lock()
        self.streams: dict[str, _Stream] = {}
        self.ids = itertools.count()
        self.frontend = frontend
        self.id_prefix = f"hf2triton-{frontend.index}-" if frontend else "hf2triton-"  # ids stay apart in the shared engine
        self.shared: SharedEngine | None = None
        self.stopping = False
        self.responses: queue.Queue[_Stream | None] = queue.Queue()
        self.started = threading.Event()
        self.error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.engine: Any = None
        self.vllm: Any = None
        self.stop_event: asyncio.Event | None = None
        self.last_poll = 0.0
        self.loop_thread = threading.Thread(target=self._run_loop, name="hf2triton-vllm-loop", daemon=True)
        count = params.response_threads or response_threads()
        names = [f"hf2triton-vllm-responses-{index}" for index in range(count)]  # the first also polls
        self.response_threads = [threading.Thread(target=self._send_responses, args=(n == names[0],), name=n, daemon=True) for n in names]
        for thread in self.response_threads:
            thread.start()
        self.loop_thread.start()
        self.started.wait()
        if self.error is not None:
            self._stop_responses()
            raise RuntimeError(f"vLLM's engine did not start: {type(self.error).__name__}: {self.error}") from self.error

    # ------------------------------------------------------------------ the loop thread

    def _run_loop(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as err:  # noqa: BLE001 - reported to initialize(), which fails the model's load
            self.error = self.error or err
        finally:
            self.started.set()

    async def _main(self) -> None:
        api = self.api()
        self.loop = asyncio.get_running_loop()
        self.stop_event = asyncio.Event()
        if self.frontend is None:
            self.engine = api.engine(engine_arguments(self.params))
        else:
            self.shared = api.shared_engine(engine_arguments(self.params), self.frontend, self.log)
            self.engine = self.shared.llm
        self.vllm = api
        try:
            self.started.set()
            await self.stop_event.wait()
            with self.lock:  # requests still open end as cancelled, each with its final response
                streams = list(self.streams.values())
            for stream in streams:
                stream.cancelled = True
            for _ in range(2):  # a request scheduled but not started starts now (task, then first step) and ends
                await asyncio.sleep(0)
            tasks = [stream.task for stream in streams if stream.task is not None and not stream.task.done()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=STOP_GRACE_S)
        finally:
            (self.shared or self.engine).shutdown()

    async def _generate(self, stream: _Stream) -> None:
        sequence = stream.sequence
        stream.task = asyncio.current_task()
        generated, reason, stop_reason, message, last = 0, None, None, "", ""
        echo_only = sequence.sampling.max_new_tokens == 0  # the prompt's log-probabilities only: vLLM's 1 token dropped
        prompt_done = False  # its log-probabilities recorded (they come with the first output)
        try:
            if stream.cancelled:  # its client left before it started
                raise asyncio.CancelledError
            prompt, sampling = self.vllm.request(sequence.prompt_ids, sequence.sampling)
            async with asyncio.timeout(sequence.sampling.time_limit_s or None):
                async with contextlib.aclosing(self.engine.generate(prompt, sampling, stream.request_id)) as outputs:
                    async for output in outputs:
                        completion = output.outputs[0]
                        if sequence.sampling.wants_logprobs:  # before the text: its response carries them
                            prompt_done = self._record_logprobs(sequence, output, completion, echo_only, prompt_done)
                        if echo_only:
                            if output.finished:
                                reason = "length"
                                break
                            continue
                        generated += len(completion.token_ids)
                        if output.finished:
                            reason, stop_reason, last = completion.finish_reason, completion.stop_reason, completion.text
                            if reason == "error":  # vLLM's own (e.g. its grammar refused the sampled token): no message
                                message = ENGINE_ERROR
                            break
                        self._post(stream, completion.text)
                        if stream.cancelled:
                            await self.engine.abort(stream.request_id)
                            reason = "abort"
                            break
        except TimeoutError:  # generation.time_limit_s (closing the generator aborted it in the engine)
            reason = "time"
        except asyncio.CancelledError:  # the client is gone (or the model is being unloaded)
            reason = "abort"
        except Exception as err:  # noqa: BLE001 - this request fails; the engine and the others go on
            reason, message = "error", f"{interface.INTERNAL_ERROR}generation failed: {type(err).__name__}: {err}"
            self.log(f"hf2triton: {message}")
        finish = Finish(finish_reason(reason), len(sequence.prompt_ids), completion_tokens(generated, reason, stop_reason), message)
        self._post(stream, last, finish)

    @staticmethod
    def _record_logprobs(sequence: Any, output: Any, completion: Any, echo_only: bool, prompt_done: bool) -> bool:
        """The output's log-probabilities onto the Sequence, where model.py's emit takes them (Sequence.take_logprobs:
        the same interface.TOKEN_LOGPROBS JSON as the torch engine's); the prompt's once, from the first output that
        has them. Returns whether the prompt's are recorded."""
        sampling = sequence.sampling
        top = max(sampling.logprobs, 0)
        prompt = getattr(output, "prompt_logprobs", None)
        if sampling.prompt_logprobs and prompt and not prompt_done:
            sequence.prompt_logprobs = prompt_token_logprobs(sequence.prompt_ids, prompt, top)
            prompt_done = True
        if sampling.logprobs >= 0 and not echo_only:
            sequence.logprobs.extend(token_logprobs(list(completion.token_ids), completion.logprobs, top))
        return prompt_done

    def _post(self, stream: _Stream, text: str, finish: Any = None) -> None:
        """Hand a piece (and, at the end, the finish) to the response thread; pieces queued but not yet sent
        are sent together."""
        with self.lock:
            pending = add_pending(stream, text, finish)
        if pending:
            self.responses.put(stream)

    # ------------------------------------------------------------------ requests in (Triton's thread)

    def submit(self, sequence: Any) -> None:
        with self.lock:
            if self.stopping:
                raise Busy("busy: the model is being unloaded; retry later")
            waiting = len(self.streams) + (self.shared.others_load() if self.shared else 0) - self.max_running
            if waiting >= self.max_queue:
                raise Busy(f"busy: {waiting} requests already wait (generation.max_queue = {self.max_queue}); retry later")
            stream = _Stream(sequence, f"{self.id_prefix}{next(self.ids)}")
            self.streams[stream.request_id] = stream
            self._count_changed()
        asyncio.run_coroutine_threadsafe(self._generate(stream), self.loop)

    def _count_changed(self) -> None:
        """The model's other frontends see this one's open requests (their admission counts them). Under the lock."""
        if self.shared is not None:
            self.shared.set_load(len(self.streams))

    def load(self) -> tuple[int, int]:
        """(running, waiting) as the torch batcher reports them."""
        with self.lock:
            count = len(self.streams)
        return min(count, self.max_running), max(0, count - self.max_running)

    # ------------------------------------------------------------------ responses out (the response thread)

    def _send_responses(self, polls: bool) -> None:
        """A response thread (batching/responder.py's scheme): a stream is sent by one thread at a time, in order;
        pieces that arrive during its send go out together next; gone clients are polled every POLL_S."""
        while True:
            try:
                stream = self.responses.get(timeout=POLL_S)
            except queue.Empty:
                if polls:
                    self._poll_cancelled()
                continue
            if stream is None:
                return
            with self.lock:
                text, finish = take_pending(stream)
                if finish is not None:
                    self.streams.pop(stream.request_id, None)
                    self._count_changed()
            try:
                stream.sequence.emit(text, finish)
            except Exception as err:  # noqa: BLE001 - a failed send ends that request, not the thread
                self.log(f"hf2triton: sending a response failed: {type(err).__name__}: {err}")
                self._cancel(stream)
            with self.lock:
                again = after_send(stream, finish is not None)
            if again:
                self.responses.put(stream)
            if polls and time.monotonic() - self.last_poll > POLL_S:
                self._poll_cancelled()

    def _stop_responses(self) -> None:
        for _ in self.response_threads:
            self.responses.put(None)

    def _poll_cancelled(self) -> None:
        """Ask about every request still open: one that gets no output (waiting for a place) is noticed too."""
        self.last_poll = time.monotonic()
        with self.lock:
            streams = [s for s in self.streams.values() if not s.cancelled and s.finish is None]
        for stream in streams:
            if ask_if_gone(stream, self.lock, stream.sequence.cancelled, self.responses.put):
                self._cancel(stream)

    def _cancel(self, stream: _Stream) -> None:
        """The loop aborts it: its coroutine is cancelled (closing vLLM's generator aborts the request in the engine)
        and sends the final "cancelled" response; one that has not started yet ends as soon as it does."""
        stream.cancelled = True
        self.loop.call_soon_threadsafe(self._cancel_task, stream)

    @staticmethod
    def _cancel_task(stream: _Stream) -> None:
        if stream.task is not None:
            stream.task.cancel()

    # ------------------------------------------------------------------ unload

    def stop(self) -> None:
        """finalize(): running requests end as cancelled (each with its final response), the engine shuts down."""
        with self.lock:
            self.stopping = True
        if self.loop is not None and self.loop_thread.is_alive():
            self.loop.call_soon_threadsafe(self.stop_event.set)
            self.loop_thread.join(timeout=STOP_GRACE_S + 60)
        self._stop_responses()
        for thread in self.response_threads:
            thread.join(timeout=STOP_GRACE_S)
