"""Snakemake adapter for target stop (logic: hf2triton.pipeline.serve.stop_step)."""

from hf2triton.pipeline.serve import stop_step
from hf2triton.pipeline.steps import run_step

params = snakemake.params
run_step(snakemake, stop_step, server=params.server, models=params.models, work=params.work, repository=params.repository)
