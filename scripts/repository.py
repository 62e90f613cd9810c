"""Snakemake adapter for rule repository (logic: hf2triton.pipeline.render.repository_step)."""

from hf2triton.pipeline.render import repository_step
from hf2triton.pipeline.steps import run_step

run_step(
    snakemake,
    repository_step,
    output=snakemake.output[0],
    serving=snakemake.params.serving,
    pretrained=snakemake.input.pretrained,
    onnx_dir=snakemake.input.get("onnx", ""),
    trt_engine=snakemake.input.get("trt_engine", ""),
)
