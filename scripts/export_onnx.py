"""Snakemake adapter for rule export_onnx (logic: hf2triton.pipeline.export.export_onnx_step)."""

from hf2triton.pipeline.export import export_onnx_step
from hf2triton.pipeline.steps import run_step

params = snakemake.params
run_step(
    snakemake,
    export_onnx_step,
    pretrained=snakemake.input.pretrained,
    task=params.task,
    opset=params.opset,
    exporter=params.exporter,
    optimize=params.optimize,
    quantize=params.quantize,
    precision=params.precision,
    output=snakemake.output[0],
)
