"""CUDA graphs per (rows, width) bucket for the encoders on a GPU: a batch of a few texts is launch-bound in eager
mode, a replay launches once. `CudaGraphs` captures the torch model and its head; `OrtGraphs` replays ONNX
Runtime's own graph of the network, then the head's torch graph. Both runtimes share the buckets and chunking.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

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


def graphs_off(failed: str) -> None:
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
            graphs_off(self.failed)
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

    def __init__(self, torch, encoder: Any, head, device: str, names: tuple[str, ...], max_length: int, pad_id: int):
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
