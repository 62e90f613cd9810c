"""Snakemake adapter for rule pretrained (logic: hf2triton.pipeline.pretrained.pretrained_step)."""

from hf2triton.pipeline.pretrained import pretrained_step
from hf2triton.pipeline.steps import run_step

run_step(
    snakemake,
    pretrained_step,
    record=snakemake.input.record,
    task=snakemake.params.task,
    output=snakemake.output[0],
    name=snakemake.wildcards.model,
)
