"""Snakemake adapter for rule repository (logic: hf2triton.render.render_model)."""

from hf2triton.render import render_model
from hf2triton.steps import run_step

params = snakemake.params
run_step(
    snakemake,
    render_model,
    output=snakemake.output[0],
    name=snakemake.wildcards.model,
    task=params.task,
    pretrained=snakemake.input.pretrained,
    max_batch_size=params.max_batch_size,
    instances=params.instances,
    kind=params.kind,
    dtype=params.dtype,
    num_threads=params.num_threads,
    max_queue_delay_us=params.max_queue_delay_us,
    max_input_bytes=params.max_input_bytes,
    generation=params.generation,
    backend=params.backend,
    onnx_dir=snakemake.input.get("onnx", ""),
    trt_engine=snakemake.input.get("trt_engine", ""),
)
