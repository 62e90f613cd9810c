"""Snakemake adapter for target status (logic: hf2triton.server.status_step)."""

from hf2triton.server import status_step
from hf2triton.steps import run_step

params = snakemake.params
run_step(snakemake, status_step, server=params.server, models=params.models, work=params.work, repository=params.repository)
