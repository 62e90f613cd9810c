"""Snakemake adapter for target status (logic: hf2triton.pipeline.serve.status_step)."""

from hf2triton.pipeline.serve import status_step
from hf2triton.pipeline.steps import run_step

params = snakemake.params
run_step(
    snakemake,
    status_step,
    server=params.server,
    models=params.models,
    work=params.work,
    repository=params.repository,
    openai=params.openai,
    built=params.built,
    validation=params.validation,
)
