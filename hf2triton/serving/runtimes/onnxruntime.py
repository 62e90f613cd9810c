"""backend onnx: the model's ONNX export run by ONNX Runtime -- an encoder answering like a transformers model
(`OrtEncoder`), a KV-cache decoder driven by its own loop (`OrtDecoder`), an image model (`OrtImageModel`) or a
speech model (optimum's ORTModel classes, `speech_model`) -- on the CPU or, with onnxruntime-gpu, on the
instance's GPU (I/O bound to torch tensors there).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

from .. import interface
from .graphs import graphs_off


def load(spec: Any):
    """The export's decoder loop for text generation, an image or speech task's model, else its encoder
    (graph-capable on a GPU with cuda_graphs)."""
    if spec.decoder:
        return OrtDecoder(spec.onnx_dir, spec.num_threads, spec.device, cuda_graphs=spec.cuda_graphs)
    if spec.auto_class in IMAGE_AUTO_CLASSES:
        return OrtImageModel(spec.onnx_dir, spec.num_threads, spec.device)
    if spec.auto_class in SPEECH_AUTO_CLASSES:
        return speech_model(spec.onnx_dir, spec.num_threads, spec.device)
    return OrtEncoder(spec.onnx_dir, spec.num_threads, spec.output, spec.device, cuda_graphs=spec.cuda_graphs)


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
            graphs_off(str(err).splitlines()[0][:300])
    if session is None:
        session = ort.InferenceSession(path, options, providers=ort_providers(device, available))
    if device.startswith("cuda") and session.get_providers()[0] != CUDA_PROVIDER:
        raise RuntimeError(
            f"backend onnx on {device}: ONNX Runtime's CUDA provider did not load (a CUDA or cuDNN library it needs is missing: "
            "the warning above in the server log names it) -- fix: install the CUDA libraries onnxruntime-gpu asks for, or set "
            "device: cpu for this model"
        )
    return session


def graph_options(session) -> tuple[bool, Any]:
    """(whether `session` can capture CUDA graphs, the RunOptions of a run that must not): a graph-capable session
    captures every run unless its options say `gpu_graph_id` -1."""
    import onnxruntime as ort

    provider_options = session.get_provider_options().get(CUDA_PROVIDER, {})
    capable = provider_options.get("enable_cuda_graph") in ("1", "True", "true")
    eager = ort.RunOptions()
    if capable:
        eager.add_run_config_entry("gpu_graph_id", "-1")
    return capable, eager


def replay_options(graph_id: int) -> Any:
    """The RunOptions of the runs of one CUDA graph: ONNX Runtime warms up, captures on a later run of this id and
    replays it from then on (ids from 1: 0 is ONNX Runtime's own)."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry("gpu_graph_id", str(graph_id))
    return options


ORT_FLOATS = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class OrtEncoder:
    """An exported encoder that answers like a transformers model: `model(**batch).<output>` as torch.

    On the CPU, numpy in and out. On a GPU (`binds_device`) the batch arrives as torch tensors on that GPU and the
    output is written into a torch tensor there (I/O binding): pooling and normalisation stay on the GPU and only
    the pooled rows come back to the host, where handing ONNX Runtime numpy would copy the ids up and the whole
    hidden state (rows x length x width floats) down on every run."""

    def __init__(self, onnx_dir: str, num_threads: int, output_name: str, device: str = "cpu", cuda_graphs: bool = False):
        from transformers import AutoConfig

        self.session = ort_session(os.path.join(onnx_dir, "model.onnx"), num_threads, device=device, cuda_graphs=cuda_graphs)
        self.graph_capable, self.eager_options = graph_options(self.session)
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
        if "position_ids" in self.input_names and "position_ids" not in feeds:  # a decoder's export (embedders)
            feeds["position_ids"] = np.maximum(feeds["attention_mask"].cumsum(1) - 1, 0)
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

    def _device_feeds(self, torch, batch: dict[str, Any], fixed: bool = False) -> dict[str, Any]:
        """The session's inputs on the device. A decoder's export takes position_ids: each row's tokens counted
        from 0 -- for a graph's `fixed` buffers (right-padded rows, masks filled in later) simply 0..length-1."""
        feeds = {name: batch[name].to(torch.int64).contiguous() for name in self.input_names if name in batch}
        if "token_type_ids" in self.input_names and "token_type_ids" not in feeds:
            feeds["token_type_ids"] = torch.zeros_like(feeds["input_ids"])
        if "position_ids" in self.input_names and "position_ids" not in feeds:
            mask = feeds["attention_mask"]
            count = torch.arange(mask.shape[1], device=mask.device).expand_as(mask) if fixed else mask.cumsum(1) - 1
            feeds["position_ids"] = count.clamp(min=0).contiguous()
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
        import torch

        feeds = self._device_feeds(torch, inputs, fixed=True)
        output = self._output(torch, feeds)
        binding = self._bind(feeds, output)
        options = replay_options(graph_id)
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

    def __init__(self, onnx_dir: str, num_threads: int, device: str = "cpu", cuda_graphs: bool = False):
        from transformers import AutoConfig, GenerationConfig

        self.right_padded = os.path.isfile(os.path.join(onnx_dir, interface.GENAI_CONFIG))
        # CUDA graphs for the builder's graph alone: the batcher replays its steps on the preallocated cache
        # (batching/onnx.py OnnxSlotBatcher); optimum's graph grows a new cache at every step
        path, graphs = os.path.join(onnx_dir, "model.onnx"), cuda_graphs and self.right_padded
        self.session = ort_session(path, num_threads, spin_within_runs=True, device=device, cuda_graphs=graphs)
        self.graph_capable, self.eager_options = graph_options(self.session)
        self.graph_ids = itertools.count(1)  # one per captured bucket, unique within the session (every batcher's)
        self.config = AutoConfig.from_pretrained(onnx_dir)
        try:
            eos = GenerationConfig.from_pretrained(onnx_dir).eos_token_id
        except OSError:  # no generation_config.json: the model config's
            eos = self.config.eos_token_id
        self.eos = np.array([t for t in (eos if isinstance(eos, list) else [eos]) if t is not None], dtype=np.int64)
        self.generation_config = SimpleNamespace(eos_token_id=self.eos.tolist())  # what the batcher reads of a model
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
        self.device_id = cuda_device_id(device)

    def new_graph_options(self) -> Any:
        """The RunOptions of a new CUDA graph of this session: an id no batcher of it has used."""
        return replay_options(next(self.graph_ids))

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
        self.session.run_with_iobinding(binding, self.eager_options)
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


IMAGE_AUTO_CLASSES = {interface.AUTO_CLASSES[task] for task in interface.IMAGE_TASKS}
SPEECH_AUTO_CLASSES = {interface.AUTO_CLASSES[interface.SPEECH_RECOGNITION], interface.CTC_AUTO_CLASS}


class OrtImageModel:
    """An image task's export (optimum: image-classification, or a dual encoder's zero-shot-image-classification
    graph) answering as the transformers model does for the engine (serving/tasks/vision.py): `model(pixel_values)
    .logits`, `model(input_ids, attention_mask, pixel_values).logits_per_image`, and a dual encoder's
    `get_image_features` / `get_text_features`. optimum exports CLIP / SigLIP as one graph of both towers, so a
    features call feeds the other tower a one-row stand-in (one image of zeros, or one token) and reads its own
    tower's (L2-normalised: the engine normalises again, unchanged) embeddings. float32 in and out; on the CPU
    numpy, on a GPU the CUDA provider copies the inputs up."""

    def __init__(self, onnx_dir: str, num_threads: int, device: str = "cpu"):
        from transformers import AutoConfig

        self.session = ort_session(os.path.join(onnx_dir, "model.onnx"), num_threads, device=device)
        self.config = AutoConfig.from_pretrained(onnx_dir)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.dtype = ORT_FLOATS.get(next(i.type for i in self.session.get_inputs() if i.name == "pixel_values"), np.float32)

    def _run(self, names: list[str], batch: dict[str, Any]) -> SimpleNamespace:
        import torch

        feeds = {}
        for name in self.input_names:
            value = batch[name].cpu().numpy() if hasattr(batch[name], "cpu") else np.asarray(batch[name])
            feeds[name] = value.astype(self.dtype if name == "pixel_values" else np.int64)
        outputs = self.session.run(names, feeds)
        return SimpleNamespace(**{name: torch.from_numpy(value) for name, value in zip(names, outputs)})

    def __call__(self, pixel_values: Any, **texts: Any) -> SimpleNamespace:
        names = ["logits_per_image"] if "logits_per_image" in self.output_names else ["logits"]
        batch = {"pixel_values": pixel_values, **texts}
        if "attention_mask" in self.input_names and "attention_mask" not in batch:  # SigLIP's tokenizer may send none
            batch["attention_mask"] = np.ones_like(np.asarray(batch["input_ids"].cpu()))
        return self._run(names, batch)

    def get_image_features(self, pixel_values: Any):
        token = np.zeros((1, 1), dtype=np.int64)
        return self._run(["image_embeds"], {"pixel_values": pixel_values, "input_ids": token, "attention_mask": token + 1}).image_embeds

    def get_text_features(self, input_ids: Any, attention_mask: Any = None, **_: Any):
        vision = self.config.vision_config
        image = np.zeros((1, vision.num_channels, vision.image_size, vision.image_size), dtype=np.float32)
        mask = attention_mask if attention_mask is not None else np.ones_like(np.asarray(input_ids.cpu()))
        return self._run(["text_embeds"], {"pixel_values": image, "input_ids": input_ids, "attention_mask": mask}).text_embeds


def speech_model(onnx_dir: str, num_threads: int, device: str = "cpu"):
    """A speech export as optimum's ORTModel (Whisper: ORTModelForSpeechSeq2Seq over its encoder and merged decoder;
    a CTC model: ORTModelForCTC), which transformers' ASR pipeline drives as it drives the torch model: its
    generate(), the generation config's forced tokens, long-form decoding, the tokenizer's decoding. Sessions made
    with this instance's options and provider (checked as `ort_session` checks)."""
    import json

    import onnxruntime as ort
    from optimum.onnxruntime import ORTModelForCTC, ORTModelForSpeechSeq2Seq

    with open(os.path.join(onnx_dir, "config.json"), encoding="utf-8") as file:
        ctc = any(str(name).endswith("ForCTC") for name in json.load(file).get("architectures") or [])
    if device.startswith("cuda") and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    providers = ort_providers(device, ort.get_available_providers())
    provider, options = providers[0] if isinstance(providers[0], tuple) else (providers[0], {})
    model = (ORTModelForCTC if ctc else ORTModelForSpeechSeq2Seq).from_pretrained(
        onnx_dir, provider=provider, provider_options=options, session_options=ort_session_options(num_threads), local_files_only=True
    )
    if ctc:  # the pipeline feeds a CTC model its `main_input_name`, which optimum's ORTModelForCTC does not name
        model.main_input_name = "input_values"
    if device.startswith("cuda") and model.providers[0] != CUDA_PROVIDER:
        raise RuntimeError(
            f"backend onnx on {device}: ONNX Runtime's CUDA provider did not load for the speech model -- fix: install the CUDA "
            "libraries onnxruntime-gpu asks for, or set device: cpu for this model"
        )
    return model
