"""Snakemake adapter for rule tensorrt_engine (logic: hf2triton.tensorrt.build_step)."""

from hf2triton.steps import run_step
from hf2triton.tensorrt import build_step

params = snakemake.params
run_step(
    snakemake,
    build_step,
    onnx_dir=snakemake.input.onnx,
    max_batch_size=params.max_batch_size,
    gpu_available=params.gpu,
    output=snakemake.output[0],
)
