"""Snakemake adapter for rule export_onnx (logic: hf2triton.export.export_onnx)."""

from hf2triton.export import export_onnx
from hf2triton.steps import run_step

params = snakemake.params
run_step(
    snakemake,
    export_onnx,
    pretrained=snakemake.input.pretrained,
    task=params.task,
    opset=params.opset,
    optimize=params.optimize,
    quantize=params.quantize,
    output=snakemake.output[0],
)
