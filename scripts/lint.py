"""Snakemake adapter for rule lint (logic: hf2triton.triton.lint.lint_step)."""

from hf2triton.pipeline.steps import run_step
from hf2triton.triton.lint import lint_step

run_step(snakemake, lint_step, model_dir=snakemake.input[0], gpu_available=snakemake.params.gpu, output=snakemake.output[0])
