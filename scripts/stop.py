"""Snakemake adapter for target stop (logic: hf2triton.server.stop_step)."""

from hf2triton.server import stop_step
from hf2triton.steps import run_step

params = snakemake.params
run_step(snakemake, stop_step, server=params.server, models=params.models, work=params.work, repository=params.repository)
