"""Snakemake adapter for rule pretrained (logic: hf2triton.pretrained.save_pretrained_model)."""

from hf2triton.pretrained import save_pretrained_model
from hf2triton.steps import run_step

run_step(snakemake, save_pretrained_model, record=snakemake.input.record, task=snakemake.params.task, output=snakemake.output[0])
