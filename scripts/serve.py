"""Snakemake adapter for target serve (logic: hf2triton.pipeline.serve.serve_step)."""

from hf2triton.pipeline.serve import serve_step
from hf2triton.pipeline.steps import run_step

params = snakemake.params
run_step(
    snakemake,
    serve_step,
    server=params.server,
    models=params.models,
    work=params.work,
    repository=params.repository,
    openai=params.openai,
    gateway_report=params.gateway_report,
)
