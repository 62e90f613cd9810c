"""Triton Python-backend model rendered by hf2triton (copied verbatim to <repository>/<name>/1/model.py).

Everything model-specific comes from the `parameters` of config.pbtxt (task, saved-model directory,
dtype, threads, limits, generation defaults), so this one file serves every task:

- `initialize` loads the saved model once, on the instance's device.
- `execute` decodes every request, answers bad ones (invalid UTF-8, empty, too long, bad options) with an
  error response of their own, and runs all good texts of the call through ONE forward pass
  (generation: one pass per distinct set of generation options), then splits the results per request.
  A streaming generation model instead hands each checked request to its batcher: the torch continuous
  batcher (generation.py) or, for backend vllm, vLLM's engine (vllm_engine.py).

The engines below are plain Python, importable without Triton: hf2triton's validation runs them
in-process as the reference the served outputs must match.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import json
import logging
import math
import os
import sys
import time
import unicodedata
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

try:  # only present inside the Triton Python-backend stub
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover - imported by tests and by the in-process reference
    pb_utils = None


def _load_sibling(name: str):
    """A serving module (interface: tensor names, parameters, limits; generation: the continuous batcher):
    the package's own when imported as hf2triton.serving.model, else the copy rendered next to this file
    (Triton loads model.py by path)."""
    if __name__ == "hf2triton.serving.model":
        return importlib.import_module(f"hf2triton.serving.{name}")
    spec = importlib.util.spec_from_file_location(
        f"hf2triton_{name}", os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


interface = _load_sibling("interface")
generation = _load_sibling("generation")
ModelParameters = interface.ModelParameters


class RequestError(ValueError):
    """A problem with one request; it gets an error response, the rest of the batch is unaffected."""


def _utf8(item: Any, name: str, what: str, max_bytes: int, limit: str) -> str:
    """One string of a BYTES tensor (Triton hands them over as bytes objects): size checked, strict UTF-8."""
    raw = item.encode("utf-8") if isinstance(item, str) else item
    if not isinstance(raw, (bytes, np.bytes_)):
        raise RequestError(f"input '{name}' must be BYTES (UTF-8 text), got {type(item).__name__}")
    if len(raw) > max_bytes:
        raise RequestError(f"{what} of {len(raw)} bytes exceeds {limit}")
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as err:
        raise RequestError(f"{what} is not valid UTF-8 (byte {err.start})") from None


def decode_texts(values: np.ndarray, max_bytes: int) -> list[str]:
    """The texts of a request, refusing empty ones (empty: nothing left once whitespace and control/format
    characters -- NUL, zero-width space/joiners, BOM, soft hyphen -- are removed: tokenizers drop or ignore
    them, so there would be no text to embed)."""

    def _visible(text: str) -> bool:
        return any(not c.isspace() and unicodedata.category(c) not in ("Cc", "Cf") for c in text)

    texts = []
    for item in values.reshape(-1):
        text = _utf8(item, interface.TEXT, "text", max_bytes, f"max_input_bytes={max_bytes}")
        if not _visible(text):
            raise RequestError("text is empty")
        texts.append(text)
    if not texts:
        raise RequestError("request holds no text")
    return texts


MAX_STOP_BYTES = 1024


def stop_strings(values: np.ndarray) -> tuple[str, ...]:
    """The `stop` strings: any text but the empty one ("\n", the most common stop string, is whitespace)."""
    stops = tuple(_utf8(v, interface.STOP, "stop string", MAX_STOP_BYTES, f"{MAX_STOP_BYTES} bytes") for v in values.reshape(-1))
    if "" in stops:
        raise RequestError(f"'{interface.STOP}' holds an empty string: every stop string needs at least one character")
    return stops


def torch_dtype(name: str, device: str):
    import torch

    if name == "auto":
        return torch.float16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def ort_session_options(num_threads: int, spin_within_runs: bool = False):
    """ONNX Runtime options for one instance: all graph optimisations, its share of the cores, no
    inter-op pool (the graphs run sequentially).

    Pool threads sleep when idle: spinning (ORT's default, also after a Run) took the cores Triton's frontend
    and this stub need between executions, and served ONNX fell to ~0.5x its in-process speed. A decoder step
    is the exception (`spin_within_runs`): ~340 small kernels per Run, each waking a sleeping thread, cost
    SmolLM2 ~27 vs ~20 ms per token on 2 cores; its threads spin inside a Run and stop when it ends
    (force_spinning_stop). Encoders served no faster that way (MiniLM, 4 runs): they keep sleeping threads
    (benchmarks/bench-2cpu/README.md)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if num_threads > 0:
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin_within_runs else "0")
    if spin_within_runs:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    return options


CUDA_PROVIDER = "CUDAExecutionProvider"


def cuda_device_id(device: str) -> int | None:
    """N of an instance's device 'cuda:N' ('cuda' alone: 0), None on the CPU."""
    if not device.startswith("cuda"):
        return None
    return int(device.partition(":")[2] or 0)


def ort_providers(device: str, available: list[str], cuda_graphs: bool = False) -> list[Any]:
    """The instance's device decides the provider, never what happens to be installed: the CPU provider on the CPU;
    on cuda:N the CUDA provider on that GPU (`cuda_graphs`: able to capture CUDA graphs), refused where this ONNX
    Runtime has none (the CPU package)."""
    if not device.startswith("cuda"):
        return ["CPUExecutionProvider"]
    if CUDA_PROVIDER not in available:
        raise RuntimeError(
            f"backend onnx on {device}: this ONNX Runtime has no CUDA provider (it offers {', '.join(available)}: the CPU "
            "package onnxruntime) -- fix: install onnxruntime-gpu in its place on this GPU host, or set device: cpu for this model"
        )
    options = {"device_id": cuda_device_id(device), **({"enable_cuda_graph": "1"} if cuda_graphs else {})}
    return [(CUDA_PROVIDER, options), "CPUExecutionProvider"]


def ort_session(path: str, num_threads: int, spin_within_runs: bool = False, device: str = "cpu", cuda_graphs: bool = False):
    """An InferenceSession on the instance's device. On a GPU the CUDA provider must be the one that loaded: ONNX
    Runtime falls back to the CPU with only a warning when a CUDA or cuDNN library is missing. `cuda_graphs`: a
    session that can capture CUDA graphs, or (a graph with nodes outside the CUDA provider, which ONNX Runtime
    refuses to capture) a plain one, logged."""
    import onnxruntime as ort

    if device.startswith("cuda") and hasattr(ort, "preload_dlls"):
        # the CUDA and cuDNN libraries of the venv's nvidia-* packages (torch's CUDA build installs them), which the
        # CUDA provider would otherwise look for only on the system's library path
        ort.preload_dlls()
    available = ort.get_available_providers()
    options = ort_session_options(num_threads, spin_within_runs)
    session = None
    if cuda_graphs and device.startswith("cuda"):
        try:
            session = ort.InferenceSession(path, options, providers=ort_providers(device, available, cuda_graphs=True))
        except Exception as err:  # noqa: BLE001 - ONNX Runtime refuses graphs for some models: they still serve
            _graphs_off(str(err).splitlines()[0][:300])
    if session is None:
        session = ort.InferenceSession(path, options, providers=ort_providers(device, available))
    if device.startswith("cuda") and session.get_providers()[0] != CUDA_PROVIDER:
        raise RuntimeError(
            f"backend onnx on {device}: ONNX Runtime's CUDA provider did not load (a CUDA or cuDNN library it needs is missing: "
            "the warning above in the server log names it) -- fix: install the CUDA libraries onnxruntime-gpu asks for, or set "
            "device: cpu for this model"
        )
    return session


ORT_FLOATS = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class OrtEncoder:
    """An exported encoder that answers like a transformers model: `model(**batch).<output>` as torch.

    On the CPU, numpy in and out. On a GPU (`binds_device`) the batch arrives as torch tensors on that GPU and the
    output is written into a torch tensor there (I/O binding): pooling and normalisation stay on the GPU and only
    the pooled rows come back to the host, where handing ONNX Runtime numpy would copy the ids up and the whole
    hidden state (rows x length x width floats) down on every run."""

    def __init__(self, onnx_dir: str, num_threads: int, output_name: str, device: str = "cpu", cuda_graphs: bool = False):
        import onnxruntime as ort
        from transformers import AutoConfig

        self.session = ort_session(os.path.join(onnx_dir, "model.onnx"), num_threads, device=device, cuda_graphs=cuda_graphs)
        provider_options = self.session.get_provider_options().get(CUDA_PROVIDER, {})
        self.graph_capable = provider_options.get("enable_cuda_graph") in ("1", "True", "true")
        self.eager_options = ort.RunOptions()
        if self.graph_capable:  # a graph-capable session captures every run unless told not to
            self.eager_options.add_run_config_entry("gpu_graph_id", "-1")
        self.config = AutoConfig.from_pretrained(onnx_dir)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_name = output_name
        self.binds_device = device.startswith("cuda")
        self.device_id = cuda_device_id(device) or 0
        (output,) = [o for o in self.session.get_outputs() if o.name == output_name]
        self.output_dims, self.output_dtype = output.shape, ORT_FLOATS.get(output.type, np.float32)

    def __call__(self, **batch):
        import torch

        if self.binds_device:
            return SimpleNamespace(**{self.output_name: self._run_bound(torch, batch)})
        feeds = {name: batch[name].cpu().numpy().astype(np.int64) for name in self.input_names if name in batch}
        if "token_type_ids" in self.input_names and "token_type_ids" not in feeds:
            feeds["token_type_ids"] = np.zeros_like(feeds["input_ids"])
        (output,) = self.session.run([self.output_name], feeds)
        return SimpleNamespace(**{self.output_name: torch.from_numpy(output)})

    def output_shape(self, rows: int, length: int) -> tuple[int, ...]:
        """The output's shape for this batch: the graph's fixed dims, its symbolic ones (batch, sequence) filled in."""
        return tuple(d if isinstance(d, int) else (rows, length)[min(i, 1)] for i, d in enumerate(self.output_dims))

    def _bind(self, feeds: dict[str, Any], output) -> Any:
        binding = self.session.io_binding()
        for name, tensor in feeds.items():
            binding.bind_input(name, "cuda", self.device_id, np.int64, tuple(tensor.shape), tensor.data_ptr())
        binding.bind_output(self.output_name, "cuda", self.device_id, self.output_dtype, tuple(output.shape), output.data_ptr())
        return binding

    def _device_feeds(self, torch, batch: dict[str, Any]) -> dict[str, Any]:
        feeds = {name: batch[name].to(torch.int64).contiguous() for name in self.input_names if name in batch}
        if "token_type_ids" in self.input_names and "token_type_ids" not in feeds:
            feeds["token_type_ids"] = torch.zeros_like(feeds["input_ids"])
        return feeds

    def _output(self, torch, feeds: dict[str, Any]):
        rows, length = feeds["input_ids"].shape
        dtype = getattr(torch, np.dtype(self.output_dtype).name)
        return torch.empty(self.output_shape(rows, length), dtype=dtype, device=feeds["input_ids"].device)

    def _run_bound(self, torch, batch: dict[str, Any]):
        feeds = self._device_feeds(torch, batch)
        output = self._output(torch, feeds)
        binding = self._bind(feeds, output)
        # ONNX Runtime runs on its own CUDA stream: the ids torch copied up must be there first; its Run returns
        # once its stream is done, so torch may read the output right after.
        torch.cuda.current_stream(output.device).synchronize()
        self.session.run_with_iobinding(binding, self.eager_options)
        return output

    def graph_run(self, inputs: dict[str, Any], graph_id: int) -> Callable[[], Any]:
        """A run of one CUDA graph over fixed buffers (`inputs`, and the output it returns): ONNX Runtime captures
        it on an early call and replays it from then on; the buffers' addresses must never change."""
        import onnxruntime as ort
        import torch

        feeds = self._device_feeds(torch, inputs)
        output = self._output(torch, feeds)
        binding = self._bind(feeds, output)
        options = ort.RunOptions()
        options.add_run_config_entry("gpu_graph_id", str(graph_id))
        stream = torch.cuda.current_stream(output.device)

        def run():
            stream.synchronize()
            self.session.run_with_iobinding(binding, options)
            return output

        run.buffers = feeds  # the binding holds raw pointers: the tensors live as long as the run

        return run


class OrtDecoder:
    """A KV-cache decoder export (ONNX Runtime GenAI's builder, or optimum's text-generation-with-past) driven
    by a lean loop instead of optimum + HF `generate` (which cost 6-8 ms per token on 2 cores, 15-20% of a
    step: benchmarks/generation-2cpu/decoder-steps.md). The KV cache stays in ONNX Runtime's own values from
    step to step; only the logits come to numpy. On a GPU the present key/values are bound to the device (I/O
    binding): a plain Run copies every output to the host, so the whole cache crossed PCIe twice per token.
    Same choices as `generate(do_sample=temperature > 0, top_k=None, top_p=None)`: argmax, or a draw from
    softmax(logits / temperature); a row that produced an end-of-sequence token is padded from then on.

    The builder's GroupQueryAttention takes right-padded rows: it reads each row's length from the mask's sum
    (its rotary positions start at the row's first token) and appends a row's new key/value right after its
    own tokens, so prompts move to the left and each step adds a column of ones to the mask."""

    def __init__(self, onnx_dir: str, num_threads: int, device: str = "cpu"):
        from transformers import AutoConfig, GenerationConfig

        self.session = ort_session(os.path.join(onnx_dir, "model.onnx"), num_threads, spin_within_runs=True, device=device)
        self.config = AutoConfig.from_pretrained(onnx_dir)
        try:
            eos = GenerationConfig.from_pretrained(onnx_dir).eos_token_id
        except OSError:  # no generation_config.json: the model config's
            eos = self.config.eos_token_id
        self.eos = np.array([t for t in (eos if isinstance(eos, list) else [eos]) if t is not None], dtype=np.int64)
        inputs = self.session.get_inputs()
        self.input_names = {i.name for i in inputs}
        # (name, heads, head size, dtype) of every past key / value input; newer builders leave the head size
        # symbolic ('kv_cache_dim', GenAI 0.15), so symbolic dims come from the model config
        heads = self.config.num_key_value_heads if hasattr(self.config, "num_key_value_heads") else self.config.num_attention_heads
        head_size = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.config.num_attention_heads
        self.past = [
            (
                i.name,
                i.shape[1] if isinstance(i.shape[1], int) else heads,
                i.shape[3] if isinstance(i.shape[3], int) else head_size,
                np.float16 if "16" in i.type else np.float32,
            )
            for i in inputs
            if i.name.startswith("past_key_values")
        ]
        self.outputs = ["logits", *(name.replace("past_key_values", "present") for name, *_ in self.past)]
        self.right_padded = os.path.isfile(os.path.join(onnx_dir, interface.GENAI_CONFIG))
        self.device_id = cuda_device_id(device)

    def _run(self, feeds: dict[str, Any]) -> list:
        """[logits on the host, present key/values where the graph ran]."""
        if self.device_id is None:
            return self.session.run_with_ort_values(self.outputs, feeds)
        binding = self.session.io_binding()
        for name, value in feeds.items():
            binding.bind_ortvalue_input(name, value)
        binding.bind_output(self.outputs[0])  # the sampler reads the logits on the host
        for name in self.outputs[1:]:
            binding.bind_output(name, "cuda", self.device_id)
        self.session.run_with_iobinding(binding)
        return binding.get_outputs()

    def _feeds(self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, past: list) -> dict[str, Any]:
        import onnxruntime as ort

        arrays = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
        feeds = {k: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items() if k in self.input_names}
        return {**feeds, **dict(zip((name for name, *_ in self.past), past))}

    def generate(self, ids: np.ndarray, mask: np.ndarray, max_new_tokens: int, pad_id: int, temperature: float = 0.0) -> np.ndarray:
        """New token ids [batch, <= max_new_tokens] for left-padded prompts `ids` / `mask`."""
        import onnxruntime as ort

        rows = ids.shape[0]
        mask = mask.astype(np.int64)
        ids = ids.astype(np.int64)
        last_prompt_token = np.full(rows, ids.shape[1] - 1)
        if self.right_padded:  # each row's tokens first, in order (a stable sort of "is padding")
            order = np.argsort(mask == 0, axis=1, kind="stable")
            ids, mask = np.take_along_axis(ids, order, 1), np.take_along_axis(mask, order, 1)
            last_prompt_token = mask.sum(axis=1) - 1
        positions = np.where(mask == 0, 1, mask.cumsum(-1) - 1)
        past = [ort.OrtValue.ortvalue_from_numpy(np.zeros((rows, heads, 0, dim), dtype)) for _, heads, dim, dtype in self.past]
        feeds = self._feeds(ids, mask, positions, past)
        finished, picked = np.zeros(rows, dtype=bool), []
        rng = np.random.default_rng() if temperature > 0 else None
        for step in range(max_new_tokens):
            logits, *past = self._run(feeds)
            logits = logits.numpy()
            last = logits[np.arange(rows), last_prompt_token] if step == 0 else logits[:, -1, :]
            tokens = np.where(finished, pad_id, _next_tokens(last, temperature, rng))
            picked.append(tokens)
            finished |= np.isin(tokens, self.eos)
            if finished.all():
                break
            mask = np.concatenate([mask, np.ones((rows, 1), dtype=np.int64)], axis=1)
            positions = positions[:, -1:] + 1
            feeds = self._feeds(tokens[:, None], mask, positions, past)
        return np.stack(picked, axis=1) if picked else np.zeros((rows, 0), dtype=np.int64)


def _next_tokens(logits: np.ndarray, temperature: float, rng) -> np.ndarray:
    if rng is None:  # float16 logits widen exactly: the same argmax
        return logits.argmax(axis=-1)
    scaled = logits.astype(np.float64) / temperature
    probs = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    return np.array([rng.choice(len(row), p=row) for row in probs], dtype=np.int64)


class TrtEncoder:
    """A TensorRT engine (built by hf2triton.pipeline.tensorrt from the ONNX export) run on torch CUDA buffers,
    answering like a transformers model. Needs the `tensorrt` package and a CUDA GPU."""

    def __init__(self, engine_path: str, config_dir: str, output_name: str, device: str):
        import tensorrt as trt
        import torch
        from transformers import AutoConfig

        self.trt, self.torch, self.device, self.output_name = trt, torch, device, output_name
        with open(engine_path, "rb") as handle:
            self.engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(handle.read())
        if self.engine is None:
            raise RuntimeError(f"TensorRT could not load {engine_path} (built by another TensorRT version or GPU?)")
        self.context = self.engine.create_execution_context()
        self.config = AutoConfig.from_pretrained(config_dir)
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.input_names = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]

    def _torch_dtype(self, name: str):
        trt, torch = self.trt, self.torch
        return {trt.int32: torch.int32, trt.int64: torch.int64, trt.float16: torch.float16, trt.float32: torch.float32}[
            self.engine.get_tensor_dtype(name)
        ]

    def __call__(self, **batch):
        torch = self.torch
        keep = []
        for name in self.input_names:
            value = batch.get(name)
            if value is None:
                value = torch.zeros_like(batch["input_ids"])
            value = value.to(self.device, self._torch_dtype(name)).contiguous()
            keep.append(value)
            self.context.set_input_shape(name, tuple(value.shape))
            self.context.set_tensor_address(name, value.data_ptr())
        shape = tuple(self.context.get_tensor_shape(self.output_name))
        output = torch.empty(shape, dtype=self._torch_dtype(self.output_name), device=self.device)
        self.context.set_tensor_address(self.output_name, output.data_ptr())
        stream = torch.cuda.current_stream(self.device)
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execution failed")
        stream.synchronize()
        return SimpleNamespace(**{self.output_name: output})


GRAPH_ROWS = (1, 2, 4, 8, 16, 32, 64)
GRAPH_MIN_WIDTH = 16
GRAPH_MAX_TOKENS = 8192


def graph_bucket(rows: int, width: int, max_length: int) -> tuple[int, int] | None:
    """The (rows, width) a CUDA graph serves a batch with -- rows rounded up to GRAPH_ROWS, width to a power of
    two (at most the model's length) -- or None: too big to gain from a graph (eager)."""
    padded_rows = next((r for r in GRAPH_ROWS if r >= rows), None)
    padded_width = GRAPH_MIN_WIDTH
    while padded_width < width:
        padded_width *= 2
    padded_width = max(min(padded_width, max_length), width)
    if padded_rows is None or padded_rows * padded_width > GRAPH_MAX_TOKENS:
        return None
    return padded_rows, padded_width


def graph_chunks(bucket: list[int], lengths: list[int], max_length: int) -> list[list[int]]:
    """Cut a length bucket (positions in ascending token length, as `length_buckets` makes them) into runs that
    each fit a CUDA graph bucket (`graph_bucket`), so a big request replays graphs too instead of running eagerly
    (eager kernels cost the host ~1 ms with ONNX Runtime, ~4 ms with torch, of launches per pass: MiniLM on the H200,
    benchmarks/h200/onnx/). Texts too long for any graph stay together as one eager pass."""
    chunks: list[list[int]] = [[]]
    for position, index in enumerate(bucket):
        if graph_bucket(1, lengths[index], max_length) is None:  # this text and the longer ones after it
            chunks.append(bucket[position:])
            break
        if chunks[-1] and graph_bucket(len(chunks[-1]) + 1, lengths[index], max_length) is None:
            chunks.append([])
        chunks[-1].append(index)
    return [chunk for chunk in chunks if chunk]


def static_inputs(torch, shape: tuple[int, int], names: tuple[str, ...], device: str, pad_id: int) -> dict[str, Any]:
    """A graph's fixed input buffers: padding rows that attend to their first token only (no NaN rows)."""
    inputs = {name: torch.zeros(shape, dtype=torch.int64, device=device) for name in names}
    inputs["input_ids"].fill_(pad_id)
    inputs["attention_mask"][:, 0] = 1
    return inputs


def fill_static(inputs: dict[str, Any], batch: dict[str, Any], pad_id: int) -> None:
    """Copy a batch into a bucket's fixed buffers: extra columns are masked padding (real rows' results do not
    change), extra rows attend to their first token only and are dropped by the caller."""
    rows, width = batch["input_ids"].shape
    inputs["input_ids"].fill_(pad_id)
    for name, buffer in inputs.items():
        if name != "input_ids":
            buffer.zero_()
        buffer[:rows, :width].copy_(batch[name])
    inputs["attention_mask"][rows:, 0] = 1


def capture_graph(torch, device: str, pool, work: Callable[[], Any]):
    """(graph, outputs): `work` warmed up twice on a side stream (lazy initialisation, library handles), then
    captured into a torch CUDA graph that shares `pool`."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            work()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = work()
    return graph, outputs


def _graphs_off(failed: str) -> None:
    logging.getLogger(__name__).warning("CUDA graphs off for this model (capture failed: %s)", failed)


class BucketGraphs:
    """CUDA graphs per (rows, width) bucket (`graph_bucket`), captured on first use over fixed input buffers: a batch
    is copied into its bucket's buffers, the bucket's graphs replay, and its rows are cut from the fixed outputs.
    Subclasses capture (`_capture`). One that cannot be captured turns graphs off for the model: it runs eagerly
    (logged)."""

    def __init__(self, torch, device: str, names: tuple[str, ...], max_length: int, pad_id: int):
        self.torch, self.device, self.names = torch, device, names
        self.max_length, self.pad_id = max_length, pad_id
        self.graphs: dict[tuple[int, int], tuple[Callable[[], Any], dict, dict]] = {}  # shape -> (replay, inputs, outputs)
        self.pool = None  # one memory pool: an instance replays one graph at a time, outputs copied out before the next
        self.failed = ""

    def _capture(self, shape: tuple[int, int]) -> tuple[Callable[[], Any], dict, dict]:
        raise NotImplementedError

    def chunks(self, bucket: list[int], lengths: list[int]) -> list[list[int]]:
        """The passes a length bucket runs as: graph-sized chunks (`graph_chunks`), or whole once graphs are off."""
        return [bucket] if self.failed else graph_chunks(bucket, lengths, self.max_length)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any] | None:
        """The outputs for `batch` (device tensors), or None: run it eagerly."""
        rows, width = batch["input_ids"].shape
        shape = graph_bucket(rows, width, self.max_length)
        if shape is None or self.failed:
            return None
        try:
            if shape not in self.graphs:
                if self.pool is None:
                    self.pool = self.torch.cuda.graph_pool_handle()
                self.graphs[shape] = self._capture(shape)
            replay, inputs, outputs = self.graphs[shape]
        except Exception as err:  # noqa: BLE001 - a model that cannot be captured still serves, eagerly
            self.failed = f"{type(err).__name__}: {err}"
            _graphs_off(self.failed)
            return None
        fill_static(inputs, batch, self.pad_id)
        replay()
        return {name: value[:rows] for name, value in outputs.items()}


class CudaGraphs(BucketGraphs):
    """`compute(batch)` replayed from torch CUDA graphs on a GPU: a batch of a few texts is launch-bound in eager mode
    (MiniLM: ~4.7 ms per forward at batch 1 on the H200, whatever the length); a replay launches once.

    The model gets a square (rows, width, width) mask built on the GPU: transformers' 2-D mask path asks the GPU
    whether the mask is all ones (a host sync, which a capture forbids)."""

    def __init__(self, torch, compute, device: str, names: tuple[str, ...], max_length: int, pad_id: int):
        super().__init__(torch, device, names, max_length, pad_id)
        self.compute = compute

    def _capture(self, shape: tuple[int, int]) -> tuple[Callable[[], Any], dict, dict]:
        inputs = static_inputs(self.torch, shape, self.names, self.device, self.pad_id)
        graph, outputs = capture_graph(self.torch, self.device, self.pool, lambda: self.compute(inputs, square_mask=True))
        return graph.replay, inputs, outputs


class OrtGraphs(BucketGraphs):
    """The ONNX Runtime counterpart of CudaGraphs for an exported encoder on a GPU: per bucket, ONNX Runtime's own
    CUDA graph of the network (`enable_cuda_graph`, one `gpu_graph_id` per bucket, inputs and output bound to fixed
    torch buffers) and the task's head (pooling and normalisation, softmax) as a torch CUDA graph over that output,
    replayed right after. Two launches per batch instead of ~100 kernels (H200, MiniLM float16, batch 1: the bare
    session 0.55-0.63 ms eager, 0.19 ms replayed; pooling as separate kernels another 0.35-0.46 ms:
    benchmarks/h200/onnx/). Batches beyond the buckets run the same session eagerly (`gpu_graph_id` -1)."""

    def __init__(self, torch, encoder: OrtEncoder, head, device: str, names: tuple[str, ...], max_length: int, pad_id: int):
        super().__init__(torch, device, names, max_length, pad_id)
        self.encoder, self.head = encoder, head

    def _capture(self, shape: tuple[int, int]) -> tuple[Callable[[], Any], dict, dict]:
        inputs = static_inputs(self.torch, shape, self.names, self.device, self.pad_id)
        run = self.encoder.graph_run(inputs, len(self.graphs) + 1)  # graph ids from 1 (0 is ONNX Runtime's own)
        output = run()  # ONNX Runtime warms up, then captures on a later run of this id
        run()
        head_graph, outputs = capture_graph(self.torch, self.device, self.pool, lambda: self.head(output, inputs))

        def replay() -> None:
            run()
            head_graph.replay()

        return replay, inputs, outputs


class Engine:
    """Saved model + tokenizer on one device; subclasses implement `run` for a list of texts.

    backend "python" runs the transformers model with torch; "onnx" the optimum export with ONNX Runtime;
    "tensorrt" an engine built from that export. All answer `model(**batch)` alike, so `run` is shared."""

    outputs: tuple[str, ...] = ()
    auto_class = ""
    onnx_output = ""

    def __init__(
        self,
        model_dir: str,
        device: str = "cpu",
        dtype: str = "auto",
        num_threads: int = 0,
        backend: str = "python",
        onnx_dir: str = "",
        trt_engine: str = "",
        **options: Any,
    ):
        import torch
        import transformers

        if device == "cpu" and num_threads > 0:
            # torch only pools and converts around ONNX Runtime / TensorRT: one thread, so no idle OpenMP worker
            # spins on the cores the engine's own pool needs (measured: benchmarks/bench-2cpu/README.md)
            torch.set_num_threads(num_threads if backend == "python" else 1)
        if num_threads > 0:  # the Rust tokenizer's thread pool: this instance's share of the cores, not all of them
            os.environ.setdefault("RAYON_NUM_THREADS", str(num_threads))
        self.torch = torch
        self.device = device
        self.options = options
        self.backend = backend
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.setup(model_dir)
        if backend == "python":
            model = getattr(transformers, self.auto_class).from_pretrained(model_dir)
            self.model = model.to(device=device, dtype=torch_dtype(dtype, device)).eval()
        elif backend == "onnx":
            self.model = self.load_onnx(onnx_dir, num_threads, device)
            if not getattr(self.model, "binds_device", False):
                self.device = "cpu"  # inputs are handed to ONNX Runtime as numpy (on a GPU: copied there by the provider)
        elif backend == "tensorrt":
            self.model = TrtEncoder(trt_engine, onnx_dir, self.onnx_output, device)
        else:
            raise ValueError(f"unknown backend {backend!r}")
        self.max_length = self._max_length(model_dir)
        self.pad_id = self.tokenizer.pad_token_id
        self.fast_tokenizer = self._fast_tokenizer()
        # Smallest length bucket: GPUs want big batches; on CPUs padding costs more than small passes do
        # (min 2 vs 8, 20-90-word texts, 2 cores: ONNX int8 +13-30%, fp32 +6-50%, torch +3-19%; bench-2cpu/README.md).
        self.min_bucket = int(options.get("min_bucket") or (64 if self.device.startswith("cuda") else 2))
        self.pad_multiple = int(options.get("pad_multiple") or (8 if self.device.startswith("cuda") else 1))
        self.graphs = None
        if self.device.startswith("cuda") and options.get("cuda_graphs") and self.fast_tokenizer is not None:
            names = ("input_ids", "attention_mask", *(("token_type_ids",) if "token_type_ids" in self.tokenizer.model_input_names else ()))
            if backend == "python":
                self.graphs = CudaGraphs(torch, self.compute, self.device, names, self.max_length, self.pad_id)
            elif getattr(self.model, "graph_capable", False):
                self.graphs = OrtGraphs(torch, self.model, self.head, self.device, names, self.max_length, self.pad_id)

    def setup(self, model_dir: str) -> None:
        """Task-specific preparation before the model loads."""

    def load_onnx(self, onnx_dir: str, num_threads: int, device: str):
        return OrtEncoder(onnx_dir, num_threads, self.onnx_output, device, cuda_graphs=bool(self.options.get("cuda_graphs")))

    def _max_length(self, model_dir: str) -> int:
        limits = [getattr(self.model.config, "max_position_embeddings", None), self.tokenizer.model_max_length]
        st_config = os.path.join(model_dir, "sentence_bert_config.json")
        if os.path.isfile(st_config):
            with open(st_config) as handle:
                limits.append(json.load(handle).get("max_seq_length"))
        return min(int(x) for x in limits if isinstance(x, (int, float)) and 0 < x < 1e9)

    def encode(self, texts: list[str]):
        """Tokenise, pad to the longest text, and move to the device (one batch)."""
        if self.fast_tokenizer is None:
            batch = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
            return {k: v.to(self.device) for k, v in batch.items()}
        return self.pad(self.tokenize(texts))

    def pad(self, encodings: list) -> dict[str, Any]:
        """Right-padded id / mask (/ token type) tensors on the device from Rust `Encoding`s."""
        return {k: self.torch.from_numpy(v).to(self.device) for k, v in self.pad_arrays(encodings).items()}

    def pad_arrays(self, encodings: list) -> dict[str, np.ndarray]:
        """Host arrays, padded to the longest text rounded up to `pad_multiple` tokens (on GPUs 8: fewer
        distinct shapes for the kernels to meet, tensor-core friendly widths; masked, so results are equal)."""
        lengths = [len(e.ids) for e in encodings]
        width = max(lengths)
        if self.pad_multiple > 1:
            width = min(-(-width // self.pad_multiple) * self.pad_multiple, max(self.max_length, width))
        # Vectorised: one flat array of all ids scattered through the mask (a per-row Python loop cost
        # as much as the Rust tokenisation at batch 256 on the H200).
        valid = np.arange(width)[None, :] < np.asarray(lengths)[:, None]
        ids = np.full((len(encodings), width), self.pad_id, dtype=np.int64)
        ids[valid] = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int64, count=sum(lengths))
        mask = valid.astype(np.int64)
        types = np.zeros_like(ids)
        if "token_type_ids" in self.tokenizer.model_input_names:
            types[valid] = np.fromiter(itertools.chain.from_iterable(e.type_ids for e in encodings), dtype=np.int64, count=sum(lengths))
        arrays = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.tokenizer.model_input_names:
            arrays["token_type_ids"] = types
        return arrays

    def tokenize(self, texts: list[str]) -> list:
        """Rust `Encoding`s of `texts` (fast tokenizers), without character offsets where the tokenizers library
        can skip them (`encode_batch_fast`): nothing here reads offsets, and skipping them tokenises MiniLM's corpus
        1.2-1.3x faster (16 texts 1.16-1.41 vs 1.50-1.76 ms, 256 texts 15.3-17.2 vs 20.4-22.9 ms on 2 cores, same ids:
        benchmarks/tokenize_offsets.py) -- most of a served request's time on a GPU (benchmarks/h200/onnx/)."""
        fast = self.fast_tokenizer
        return getattr(fast, "encode_batch_fast", fast.encode_batch)(texts)

    def batches(self, texts: list[str]):
        """Yield (positions, device batch) covering `texts`.

        Fast tokenizers: `encode_batch` tokenises all texts in parallel Rust threads (2.5-3x faster than
        the tokenizer's __call__, whose per-token Python objects dominated; profiled in benchmarks/README.md),
        then texts are grouped by token length so padding stays small (`length_buckets`). Same ids and masks
        as __call__ (tested); results are put back in request order by the caller."""
        if self.fast_tokenizer is None:
            yield list(range(len(texts))), self.encode(texts)
            return
        encodings = self.tokenize(texts)
        lengths = [len(e.ids) for e in encodings]
        for bucket in length_buckets(lengths, self.min_bucket):
            for chunk in self.graphs.chunks(bucket, lengths) if self.graphs is not None else [bucket]:
                yield chunk, self.pad([encodings[i] for i in chunk])

    def run_buckets(self, texts: list[str], forward) -> dict[str, np.ndarray]:
        """`forward(batch) -> {output: array}` over the length buckets, reassembled in the order of `texts`."""
        results: dict[str, np.ndarray] = {}
        for positions, batch in self.batches(texts):
            for name, values in forward(batch).items():
                if name not in results:
                    results[name] = np.empty((len(texts), *values.shape[1:]), dtype=values.dtype)
                results[name][positions] = values
        return results

    def compute(self, batch: dict[str, Any], square_mask: bool = False) -> dict[str, Any]:
        """The task's outputs as device tensors (encoders; inside inference mode)."""
        return self.head(getattr(self.model_outputs(batch, square_mask), self.onnx_output), batch)

    def head(self, output, batch: dict[str, Any]) -> dict[str, Any]:
        """The task's outputs from the network's (`onnx_output`: last_hidden_state, logits) on the device."""
        raise NotImplementedError

    def model_outputs(self, batch: dict[str, Any], square_mask: bool):
        if not square_mask:
            return self.model(**batch)
        mask = batch["attention_mask"]
        return self.model(**{**batch, "attention_mask": mask[:, None, :].expand(-1, mask.shape[1], -1)})

    def tensors(self, batch: dict[str, Any]) -> dict[str, Any]:
        """`compute(batch)`, from a CUDA graph where one applies."""
        with self.torch.inference_mode():
            outputs = self.graphs(batch) if self.graphs is not None else None
            return outputs if outputs is not None else self.compute(batch)

    def _fast_tokenizer(self):
        """A private copy of the Rust tokenizer set to truncate like `encode` (None: use __call__).
        Right-padded encoders only; generation pads left and keeps __call__."""
        backend = getattr(self.tokenizer, "_tokenizer", None)
        if backend is None or not getattr(self.tokenizer, "is_fast", False) or self.tokenizer.padding_side != "right":
            return None
        if self.tokenizer.pad_token_id is None:
            return None
        fast = copy.deepcopy(backend)
        fast.no_padding()
        fast.enable_truncation(self.max_length, direction=self.tokenizer.truncation_side)
        return fast


class EmbeddingEngine(Engine):
    """feature-extraction: pooled (mean / cls / max, from the sentence-transformers config), L2-normalised FP32."""

    outputs = (interface.EMBEDDING, interface.PROMPT_TOKENS)
    auto_class = interface.AUTO_CLASSES[interface.FEATURE_EXTRACTION]
    onnx_output = "last_hidden_state"

    def setup(self, model_dir: str) -> None:
        pooling_file = os.path.join(model_dir, "1_Pooling", "config.json")
        self.pooling = "mean"
        if os.path.isfile(pooling_file):
            with open(pooling_file) as handle:
                pooling = json.load(handle)
            for mode in ("cls_token", "max_tokens", "mean_tokens"):
                if pooling.get(f"pooling_mode_{mode}"):
                    self.pooling = mode.split("_")[0]
                    break

    def run(self, texts: list[str], **_: Any) -> dict[str, np.ndarray]:
        return self.run_buckets(texts, self.forward)

    def head(self, hidden, batch: dict[str, Any]) -> dict[str, Any]:
        torch = self.torch
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        elif self.pooling == "max":
            pooled = hidden.masked_fill(mask == 0, -1e4).max(dim=1).values
        else:
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return {
            interface.EMBEDDING: torch.nn.functional.normalize(pooled.float(), p=2, dim=1),
            interface.PROMPT_TOKENS: batch["attention_mask"].sum(dim=1).to(torch.int32),
        }

    def forward(self, batch: dict[str, Any]) -> dict[str, np.ndarray]:
        out = self.tensors(batch)
        return {
            interface.EMBEDDING: out[interface.EMBEDDING].cpu().numpy().astype(np.float32),
            interface.PROMPT_TOKENS: out[interface.PROMPT_TOKENS].cpu().numpy().astype(np.int32),
        }


class ClassificationEngine(Engine):
    """text-classification: top label (from the model config's id2label) and its probability."""

    outputs = (interface.LABEL, interface.SCORE)
    auto_class = interface.AUTO_CLASSES[interface.CLASSIFICATION]
    onnx_output = "logits"

    def run(self, texts: list[str], **_: Any) -> dict[str, np.ndarray]:
        scored = self.run_buckets(texts, self.forward)
        id2label = self.model.config.id2label
        labels = [str(id2label.get(int(i), int(i))).encode("utf-8") for i in scored["label_id"].tolist()]
        return {interface.LABEL: np.array(labels, dtype=np.object_), interface.SCORE: scored[interface.SCORE]}

    def head(self, logits, batch: dict[str, Any]) -> dict[str, Any]:
        torch = self.torch
        logits = logits.float()
        if getattr(self.model.config, "problem_type", None) == "multi_label_classification":
            probs = torch.sigmoid(logits)
        else:
            probs = torch.softmax(logits, dim=-1)
        scores, ids = probs.max(dim=-1)
        return {"label_id": ids, interface.SCORE: scores}

    def forward(self, batch: dict[str, Any]) -> dict[str, np.ndarray]:
        out = self.tensors(batch)
        return {"label_id": out["label_id"].cpu().numpy(), interface.SCORE: out[interface.SCORE].cpu().numpy().astype(np.float32)}


PARTIAL_CHARACTER = "\ufffd"
MAX_TOKENS_PER_CHARACTER = 4  # a UTF-8 character is at most 4 bytes, so at most 4 byte-level tokens


class GenerationEngine(Engine):
    """text-generation: chat template when the tokenizer has one, greedy unless temperature > 0."""

    outputs = (interface.TEXT_OUTPUT,)
    auto_class = interface.AUTO_CLASSES[interface.GENERATION]

    def setup(self, model_dir: str) -> None:
        self.tokenizer.padding_side = "left"  # generation continues at the right end of every row
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    def load_onnx(self, onnx_dir: str, num_threads: int, device: str):
        return OrtDecoder(onnx_dir, num_threads, device)

    def prompt(self, text: str) -> str:
        if self.options.get("chat_template", interface.DEFAULTS.chat_template) and getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        return text

    def check_lengths(self, texts: list[str], max_new_tokens: int) -> None:
        """Raise RequestError if a prompt plus max_new_tokens exceeds the model's context."""
        for ids in self.tokenizer([self.prompt(t) for t in texts], add_special_tokens=False)["input_ids"]:
            if len(ids) + max_new_tokens > self.max_length:
                raise RequestError(
                    f"prompt of {len(ids)} tokens + max_new_tokens={max_new_tokens} exceeds the context of {self.max_length} tokens"
                )

    def run(
        self,
        texts: list[str],
        max_new_tokens: int = interface.DEFAULTS.max_new_tokens,
        temperature: float = interface.DEFAULTS.temperature,
        **_: Any,
    ) -> dict[str, np.ndarray]:
        prompts = [self.prompt(t) for t in texts]
        if isinstance(self.model, OrtDecoder):
            batch = self.tokenizer(prompts, padding=True, add_special_tokens=False, return_tensors="np")
            pad_id = self.tokenizer.pad_token_id
            new_tokens = self.model.generate(batch["input_ids"], batch["attention_mask"], max_new_tokens, pad_id, temperature).tolist()
        else:
            new_tokens = self._generate_torch(prompts, max_new_tokens, temperature)
        texts_out = [self.complete_text(ids) for ids in new_tokens]
        return {interface.TEXT_OUTPUT: np.array([t.strip().encode("utf-8") for t in texts_out], dtype=np.object_)}

    def _generate_torch(self, prompts: list[str], max_new_tokens: int, temperature: float) -> list[list[int]]:
        batch = self.tokenizer(prompts, padding=True, add_special_tokens=False, return_tensors="pt")
        batch = {k: v.to(self.device) for k, v in batch.items()}
        sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        with self.torch.inference_mode():
            out = self.model.generate(
                **batch, max_new_tokens=max_new_tokens, pad_token_id=self.tokenizer.pad_token_id, top_p=None, top_k=None, **sampling
            )
        return out[:, batch["input_ids"].shape[1] :].tolist()

    def complete_text(self, ids: list[int]) -> str:
        """Decoded text without a trailing partial character: byte-level tokens can split a multi-byte
        character, which decodes to U+FFFD when max_new_tokens cuts it; such a tail is dropped."""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = 0
        while text.endswith(PARTIAL_CHARACTER) and cut < MAX_TOKENS_PER_CHARACTER and cut < len(ids):
            cut += 1
            text = self.tokenizer.decode(ids[: len(ids) - cut], skip_special_tokens=True)
        return text if not text.endswith(PARTIAL_CHARACTER) else text.rstrip(PARTIAL_CHARACTER)


ENGINES = {
    interface.FEATURE_EXTRACTION: EmbeddingEngine,
    interface.CLASSIFICATION: ClassificationEngine,
    interface.GENERATION: GenerationEngine,
}


def engine_from_parameters(params: ModelParameters, device: str = "cpu") -> Engine:
    """Build the engine a config.pbtxt `parameters` block describes. backend vllm: the same saved model on torch,
    what stands for it outside its Triton model (validation's reference, bench's yardstick): vLLM's engine runs
    only in the vLLM environment, inside the model (VllmEngine)."""
    return ENGINES[params.task](
        params.model_dir,
        device=device,
        dtype=params.dtype,
        num_threads=params.num_threads,
        backend="python" if params.backend == "vllm" else params.backend,
        onnx_dir=params.onnx_dir,
        trt_engine=params.trt_engine,
        chat_template=params.chat_template,
        cuda_graphs=params.cuda_graphs,
    )


class VllmEngine:
    """backend vllm: vLLM's engine generates (vllm_engine.py, loaded only here, inside the vLLM environment);
    requests are tokenized, templated and checked exactly as for GenerationEngine (its `prompt`, this tokenizer,
    the served context), and `batcher` takes them as the torch continuous batcher does (submit / stop)."""

    outputs = (interface.TEXT_OUTPUT,)
    prompt = GenerationEngine.prompt

    def __init__(self, params: ModelParameters, device: str, log=print):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(params.model_dir)
        self.options = {"chat_template": params.chat_template}
        self.max_length = params.max_model_len
        self.device = device
        self.batcher = _load_sibling("vllm_engine").VllmGenerator(params, device, log)


def _one_value(raw: Any, name: str, kind: type, bounds: tuple, problem=None) -> Any:
    """The one value of an option tensor, checked against `bounds` (or `problem(value)`: why not allowed)."""
    values = {kind(v) for v in np.asarray(raw).reshape(-1)}
    if len(values) != 1:
        raise RequestError(f"{name} must hold one value per request")
    value = values.pop()
    low, high = bounds
    message = problem(value) if problem is not None else None
    if message is None and not (math.isfinite(value) and low <= value <= high):
        message = f"{name}={value} must be a finite number between {low} and {high}"
    if message:
        raise RequestError(message)
    return value


def generation_options(raw: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """Per-request max_new_tokens / temperature, checked; missing values take the configured defaults."""
    options = dict(defaults)
    if raw.get(interface.MAX_NEW_TOKENS) is not None:
        options[interface.MAX_NEW_TOKENS] = _one_value(
            raw[interface.MAX_NEW_TOKENS], interface.MAX_NEW_TOKENS, int, interface.MAX_NEW_TOKENS_RANGE
        )
    if raw.get(interface.TEMPERATURE) is not None:
        # 0 (greedy) or MIN_TEMPERATURE..100: sampling divides by it, so a denormal like 1e-45 would give NaN
        options[interface.TEMPERATURE] = _one_value(
            raw[interface.TEMPERATURE], interface.TEMPERATURE, float, interface.TEMPERATURE_RANGE, interface.temperature_problem
        )
    return options


def chat_prompt(tokenizer, messages_json: list[str]) -> str:
    """The chat template over `messages` (one JSON list of {"role", "content"}), ready for the answer."""
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError(f"this model has no chat template: send '{interface.TEXT}' instead of '{interface.MESSAGES}'")
    if len(messages_json) != 1:
        raise RequestError(f"'{interface.MESSAGES}' takes one JSON list per request, got {len(messages_json)}")
    try:
        messages = json.loads(messages_json[0])
    except ValueError as err:
        raise RequestError(f"'{interface.MESSAGES}' is not valid JSON ({err})") from None
    if not isinstance(messages, list) or not messages:
        raise RequestError(f"'{interface.MESSAGES}' must be a non-empty JSON list of {{role, content}}")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in interface.CHAT_ROLES or not isinstance(message.get("content"), str):
            roles = "/".join(interface.CHAT_ROLES)
            raise RequestError(f'messages[{index}] must be {{"role": {roles}, "content": a string}}, got {str(message)[:80]}')
    return tokenizer.apply_chat_template(
        [{"role": m["role"], "content": m["content"]} for m in messages], tokenize=False, add_generation_prompt=True
    )


def is_cancelled(request) -> bool:
    check = getattr(request, "is_cancelled", None)  # python_backend >= 23.10
    return bool(check and check())


def cancelled_response():
    code = getattr(getattr(pb_utils, "TritonError", None), "CANCELLED", None)
    error = pb_utils.TritonError("request cancelled", code) if code is not None else pb_utils.TritonError("request cancelled")
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


def error_response(message: str):
    """An error response for one request; 400-class (INVALID_ARG) where the backend supports codes."""
    code = getattr(getattr(pb_utils, "TritonError", None), "INVALID_ARG", None)
    error = pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


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
        vllm = self.params.backend == "vllm"
        self.engine = VllmEngine(self.params, device, self._log) if vllm else engine_from_parameters(self.params, device)
        self.task = self.params.task
        self.max_bytes = self.params.max_input_bytes
        self.defaults = {interface.MAX_NEW_TOKENS: self.params.max_new_tokens, interface.TEMPERATURE: self.params.temperature}
        self.batcher = self.engine.batcher if vllm else None  # vLLM's engine schedules itself
        self.responder = None  # the torch batcher's response thread (_start_batcher)
        if self.task == interface.GENERATION and self.params.streaming and not vllm:
            self._start_batcher()
        self._log(f"hf2triton: loaded {self.task} model from {self.params.model_dir} on {device} in {time.monotonic() - started:.1f} s")

    @staticmethod
    def _log(message: str) -> None:
        logger = getattr(pb_utils, "Logger", None)
        if logger is not None:
            logger.log_info(message)
        else:
            print(message, flush=True)

    def _parse(self, request) -> tuple[list[str], dict[str, Any]]:
        tensor = pb_utils.get_input_tensor_by_name(request, interface.TEXT)
        if tensor is None:
            raise RequestError(f"input '{interface.TEXT}' is missing")
        values = tensor.as_numpy()
        if values.size > self.params.max_texts_per_request:  # checked before decoding anything
            raise RequestError(f"{values.size} texts exceed max_texts_per_request={self.params.max_texts_per_request}; split the request")
        total = sum(len(item) for item in values.reshape(-1))
        if total > self.params.max_request_bytes:
            raise RequestError(f"{total} bytes of text exceed max_request_bytes={self.params.max_request_bytes}; split the request")
        texts = decode_texts(values, self.max_bytes)
        options: dict[str, Any] = {}
        if self.task == interface.GENERATION:
            raw = {}
            for name in (interface.MAX_NEW_TOKENS, interface.TEMPERATURE):
                optional = pb_utils.get_input_tensor_by_name(request, name)
                raw[name] = optional.as_numpy() if optional is not None else None
            options = generation_options(raw, self.defaults)
            self.engine.check_lengths(texts, options[interface.MAX_NEW_TOKENS])
        return texts, options

    # ------------------------------------------------------------------ streaming generation (decoupled)

    def _start_batcher(self) -> None:
        """One continuous batcher per instance, on a background thread (vllm_backend's shape): execute()
        only parses and submits; every response goes out through the request's response sender."""
        import threading

        engine = self.engine
        self.responder = generation.Responder(self._log)
        self.batcher = generation.new_batcher(
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
        )
        self.loop = threading.Thread(target=self._run_batcher, name="hf2triton-batcher", daemon=True)
        self.loop.start()

    def _run_batcher(self) -> None:
        while True:
            try:
                self.batcher.run_forever()
                return
            except Exception as err:  # noqa: BLE001 - a failed pass ends its sequences, not the loop
                message = f"generation failed: {type(err).__name__}: {err}"
                self._log(f"hf2triton: {message}")
                self.batcher.fail_all(message)

    def _optional(self, request, name: str):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return tensor.as_numpy() if tensor is not None else None

    def _sampling(self, request, options: dict[str, Any]):
        """Per-request decoding options beyond max_new_tokens/temperature (checked, with clear errors)."""
        top_p, top_k, seed, stop = (self._optional(request, n) for n in (interface.TOP_P, interface.TOP_K, interface.SEED, interface.STOP))
        values = {
            "max_new_tokens": options[interface.MAX_NEW_TOKENS],
            "temperature": options[interface.TEMPERATURE],
            "time_limit_s": self.params.time_limit_s,
        }
        if values["max_new_tokens"] > self.params.max_new_tokens_limit:
            raise RequestError(
                f"max_new_tokens={values['max_new_tokens']} exceeds generation.max_new_tokens_limit={self.params.max_new_tokens_limit}"
            )
        if top_p is not None:
            values["top_p"] = _one_value(top_p, interface.TOP_P, float, interface.TOP_P_RANGE)
        if top_k is not None:
            values["top_k"] = _one_value(top_k, interface.TOP_K, int, interface.TOP_K_RANGE)
        if seed is not None:
            values["seed"] = _one_value(seed, interface.SEED, int, interface.SEED_RANGE)
        if stop is not None:
            values["stop"] = stop_strings(stop)
        return generation.Sampling(**values)

    def _prompt(self, request, options: dict[str, Any]) -> list[int]:
        """The prompt's token ids from `text` (chat template applied as configured) or `messages` (always
        templated); prompt + max_new_tokens must fit the context."""
        text, messages = self._optional(request, interface.TEXT), self._optional(request, interface.MESSAGES)
        if (text is None) == (messages is None):
            raise RequestError(f"send either '{interface.TEXT}' or '{interface.MESSAGES}' (a JSON list of {{role, content}})")
        if text is not None:
            texts = decode_texts(text, self.max_bytes)
            if len(texts) != 1:
                raise RequestError(f"a streaming model takes one prompt per request, got {len(texts)}")
            prompt = self.engine.prompt(texts[0])
        else:
            prompt = chat_prompt(self.engine.tokenizer, decode_texts(messages, self.max_bytes))
        ids = self.engine.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        wanted, context = options[interface.MAX_NEW_TOKENS], self.engine.max_length
        if len(ids) + wanted > context:
            raise RequestError(f"prompt of {len(ids)} tokens + max_new_tokens={wanted} exceeds the context of {context} tokens")
        return ids

    def _submit(self, request) -> None:
        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            raw = {name: self._optional(request, name) for name in (interface.MAX_NEW_TOKENS, interface.TEMPERATURE)}
            options = generation_options(raw, self.defaults)
            sampling = self._sampling(request, options)
            prompt_ids = self._prompt(request, options)
            stream_flag = self._optional(request, interface.STREAM)
            stream = bool(stream_flag.reshape(-1)[0]) if stream_flag is not None else True
        except RequestError as err:
            sender.send(error_response(str(err)), flags=final)
            return
        pieces: list[str] = []

        def emit(text: str, finish) -> None:
            if finish is None:
                if stream:
                    sender.send(pb_utils.InferenceResponse(output_tensors=[_bytes(interface.TEXT_OUTPUT, text)]))
                else:
                    pieces.append(text)
                return
            if finish.reason == "error":
                sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(finish.message)), flags=final)
                return
            body = text if stream else "".join(pieces) + text
            tensors = [
                _bytes(interface.TEXT_OUTPUT, body),
                _bytes(interface.FINISH_REASON, finish.reason),
                pb_utils.Tensor(interface.PROMPT_TOKENS, np.array([finish.prompt_tokens], dtype=np.int32)),
                pb_utils.Tensor(interface.COMPLETION_TOKENS, np.array([finish.completion_tokens], dtype=np.int32)),
            ]
            sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=final)

        try:
            gone = getattr(sender, "is_cancelled", None) or (lambda: is_cancelled(request))  # a closed stream / connection
            self.batcher.submit(generation.Sequence(prompt_ids, sampling, emit, cancelled=gone))
        except generation.Busy as err:
            code = getattr(pb_utils.TritonError, "UNAVAILABLE", None)
            error = pb_utils.TritonError(str(err), code) if code is not None else pb_utils.TritonError(str(err))
            sender.send(pb_utils.InferenceResponse(output_tensors=[], error=error), flags=final)

    def execute(self, requests: list) -> list | None:
        if self.batcher is not None:
            for request in requests:
                self._submit(request)
            return None
        responses: list[Any] = [None] * len(requests)
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
            except RequestError as err:
                responses[index] = error_response(str(err))
                continue
            groups.setdefault(tuple(sorted(options.items())), []).append((index, texts))
        for options, members in groups.items():
            all_texts = [text for _, texts in members for text in texts]
            try:
                outputs = self.engine.run(all_texts, **dict(options))
            except Exception as err:  # noqa: BLE001 - one failed pass must not take the stub down
                message = f"inference failed: {type(err).__name__}: {err}"
                self._log(f"hf2triton: {message}")
                for index, _ in members:
                    responses[index] = pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))
                continue
            start = 0
            for index, texts in members:
                end = start + len(texts)
                tensors = [pb_utils.Tensor(name, _rows(outputs[name][start:end])) for name in self.engine.outputs]
                responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)
                start = end
        return responses

    def finalize(self) -> None:
        if self.batcher is not None:
            self.batcher.stop()
        if self.responder is not None:
            self.responder.stop()
        self.engine = None


def length_buckets(lengths: list[int], min_size: int, slack: float = 1.2) -> list[list[int]]:
    """Group text positions by token length so each group pads little: sorted by length, a group is
    closed once it holds `min_size` texts and the next text would make its padded size exceed `slack` x
    its real tokens. One group when that never happens (short or uniform batches)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    buckets: list[list[int]] = []
    current: list[int] = []
    real = 0
    for index in order:
        length = lengths[index]
        if len(current) >= min_size and length * (len(current) + 1) > slack * (real + length):
            buckets.append(current)
            current, real = [], 0
        current.append(index)
        real += length
    if current:
        buckets.append(current)
    return buckets


def _bytes(name: str, text: str):
    return pb_utils.Tensor(name, np.array([text.encode("utf-8")], dtype=np.object_))


def _rows(values: np.ndarray) -> np.ndarray:
    """Shape outputs as [texts, ...]: strings and scalars get a trailing dim of 1 (config dims [1])."""
    return values.reshape(-1, 1) if values.ndim == 1 else values
