"""Snakemake adapter for rule tensorrt_engine (logic: hf2triton.pipeline.tensorrt.tensorrt_engine_step)."""

from hf2triton.pipeline.steps import run_step
from hf2triton.pipeline.tensorrt import tensorrt_engine_step

params = snakemake.params
run_step(
    snakemake,
    tensorrt_engine_step,
    onnx_dir=snakemake.input.onnx,
    max_batch_size=params.max_batch_size,
    gpu_available=params.gpu,
    output=snakemake.output.engine,
)
