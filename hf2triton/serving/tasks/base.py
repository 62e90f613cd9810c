"""What every task head shares: the tokenizer, the runtime (loaded once, by backend), length buckets, padding and
CUDA graphs. Plain Python, importable without Triton: validation runs the engines in-process as the reference
the served outputs must match.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
from typing import Any

import numpy as np

from ..runtimes import RuntimeSpec, load_runtime
from ..runtimes.graphs import CudaGraphs, OrtGraphs

MEDIA_BACKENDS = ("python", "onnx")  # the image and speech tasks: torch, or their optimum export on ONNX Runtime


def media_torch(subject: str, backend: str, device: str, num_threads: int):
    """torch, for the image and speech engines (it runs their processors, and the network with backend python):
    `backend` checked (`subject` names the task in the error), the instance's share of the CPU's threads set -- with
    backend onnx one thread (ONNX Runtime's pool has the cores, as `Engine` does)."""
    import torch

    if backend not in MEDIA_BACKENDS:
        raise ValueError(f"{subject} served by torch or ONNX Runtime (backend python or onnx), not {backend}")
    if device == "cpu" and num_threads > 0:
        torch.set_num_threads(num_threads if backend == "python" else 1)
    return torch


# model types whose position ids count from padding_idx + 1 (RobertaEmbeddings and its copies): a text may use
# max_position_embeddings - padding_idx - 1 positions, not max_position_embeddings (vLLM caps these the same way)
PADDING_OFFSET_POSITIONS = frozenset(
    {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "roberta-prelayernorm", "data2vec-text", "mpnet", "ibert"}
    | {"xmod", "luke", "markuplm"}
)


class Engine:
    """Saved model + tokenizer on one device; a task's subclass (one module per task) implements `run` for a list
    of texts, and `head` for an encoder's outputs.

    The backend's runtime (hf2triton.serving.runtimes: "python" the transformers model with torch, "onnx" the
    export with ONNX Runtime, "tensorrt" an engine built from it) is loaded once here. All answer `model(**batch)`
    alike, so tokenising, length buckets, padding and CUDA graphs are shared."""

    outputs: tuple[str, ...] = ()
    auto_class = ""
    onnx_output = ""
    decoder = False  # generation: ONNX Runtime runs the export's decoder loop
    any_padding_side = False  # True: batches are padded on the right whatever the tokenizer's padding side

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
        files = {"model_dir": model_dir, "onnx_dir": onnx_dir, "trt_engine": trt_engine}
        task = {"auto_class": self.auto_class, "output": self.onnx_output, "decoder": self.decoder}
        cuda_graphs = bool(options.get("cuda_graphs"))
        spec = RuntimeSpec(**files, **task, device=device, dtype=dtype, num_threads=num_threads, cuda_graphs=cuda_graphs)
        self.model = load_runtime(backend, spec)
        if backend == "onnx" and not getattr(self.model, "binds_device", False):
            self.device = "cpu"  # inputs are handed to ONNX Runtime as numpy (on a GPU: copied there by the provider)
        self.max_length = self._max_length(model_dir)
        self.pad_id = padding_id(self.tokenizer)
        self.fast_tokenizer = self._fast_tokenizer()
        # Smallest length bucket: GPUs want big batches; on CPUs padding costs more than small passes do
        # (min 2 vs 8, 20-90-word texts, 2 cores: ONNX int8 +13-30%, fp32 +6-50%, torch +3-19%; bench-2cpu/README.md).
        self.min_bucket = int(options.get("min_bucket") or (64 if self.device.startswith("cuda") else 2))
        self.pad_multiple = int(options.get("pad_multiple") or (8 if self.device.startswith("cuda") else 1))
        self.graphs = None
        if self.device.startswith("cuda") and options.get("cuda_graphs") and self.fast_tokenizer is not None and self.graphs_allowed():
            names = ("input_ids", "attention_mask", *(("token_type_ids",) if "token_type_ids" in self.tokenizer.model_input_names else ()))
            if backend == "python":
                self.graphs = CudaGraphs(torch, self.compute, self.device, names, self.max_length, self.pad_id)
            elif getattr(self.model, "graph_capable", False):
                self.graphs = OrtGraphs(torch, self.model, self.head, self.device, names, self.max_length, self.pad_id)

    def setup(self, model_dir: str) -> None:
        """Task-specific preparation before the model loads."""

    def graphs_allowed(self) -> bool:
        """Whether this model may replay CUDA graphs (asked once the model is loaded)."""
        return True

    def _max_length(self, model_dir: str) -> int:
        config = self.model.config
        positions = getattr(config, "max_position_embeddings", None)
        if isinstance(positions, int) and getattr(config, "model_type", "") in PADDING_OFFSET_POSITIONS:
            positions -= (getattr(config, "pad_token_id", None) or 0) + 1  # position ids start after padding_idx
        limits = [positions, self.tokenizer.model_max_length]
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
        benchmarks/probes/tokenize_offsets.py) -- most of a served request's time on a GPU (benchmarks/h200/onnx/)."""
        fast = self.fast_tokenizer
        return getattr(fast, "encode_batch_fast", fast.encode_batch)(texts)

    def batches(self, texts: list[str], encodings: list | None = None):
        """Yield (positions, device batch) covering `texts` (`encodings`: theirs, when the caller has tokenised them).

        Fast tokenizers: `encode_batch` tokenises all texts in parallel Rust threads (2.5-3x faster than
        the tokenizer's __call__, whose per-token Python objects dominated; profiled in benchmarks/README.md),
        then texts are grouped by token length so padding stays small (`length_buckets`). Same ids and masks
        as __call__ (tested); results are put back in request order by the caller."""
        if self.fast_tokenizer is None:
            yield list(range(len(texts))), self.encode(texts)
            return
        encodings = encodings if encodings is not None else self.tokenize(texts)
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
        Right-padded encoders only (or a task that pads right whatever the tokenizer says: `any_padding_side`);
        generation pads left and keeps __call__."""
        backend = getattr(self.tokenizer, "_tokenizer", None)
        if backend is None or not getattr(self.tokenizer, "is_fast", False):
            return None
        if self.tokenizer.padding_side != "right" and not self.any_padding_side:
            return None
        fast = copy.deepcopy(backend)
        fast.no_padding()
        fast.enable_truncation(self.max_length, direction=self.tokenizer.truncation_side)
        return fast


def padding_id(tokenizer: Any) -> int:
    """The id right padding writes: the pad token, else (GPT-2-like encoders) EOS or 0 -- the attention mask hides
    padding, so any id answers the same, where transformers' __call__ refuses to pad at all."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if isinstance(candidate, int):
            return candidate
    return 0


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
