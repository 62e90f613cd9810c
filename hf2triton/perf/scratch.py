"""One model variant served alone on a scratch tritonserver (own ports on 127.0.0.1, own repository), for
`tune`'s sweep and `bench`'s static-generation baseline; the served server of `make serve` is not touched."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hf2triton import host
from hf2triton.pipeline.render import render_model
from hf2triton.specs import ModelSpec, ServerSpec, serving_values
from hf2triton.triton.process import start_server, stop_server
from hf2triton.triton.settings import Settings


@contextmanager
def scratch_server(
    model: ModelSpec, repository: Path, work: Path, server: ServerSpec, paths: dict[str, str], gpu_available: bool
) -> Iterator[tuple[Settings, float]]:
    """Render `model` into `repository`, serve it alone; yields (settings, seconds until ready); stops it after."""
    # alone on the scratch server: nothing reserves GPUs for it
    serving = serving_values(model, gpu_available, host.cpu_count(), gpu_count=host.gpu_count() if gpu_available else 0)
    render_model(str(repository / model.name), serving, paths["pretrained"], paths.get("onnx", ""), paths.get("trt_engine", ""))
    http_port, grpc_port, metrics_port = host.free_ports(3)
    scratch = dataclasses.replace(server, host="127.0.0.1", http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
    settings = Settings.of(scratch, [model.name], str(work), str(repository))
    started = time.perf_counter()
    try:
        start_server(settings)
        yield settings, round(time.perf_counter() - started, 1)
    finally:
        stop_server(settings)
