"""Snakemake adapter for rule validate (logic: hf2triton.pipeline.validate.validate_step)."""

from hf2triton.pipeline.steps import run_step
from hf2triton.pipeline.validate import validate_step

params = snakemake.params
run_step(
    snakemake,
    validate_step,
    server=params.server,
    models=params.models,
    work=params.work,
    repository=params.repository,
    output_json=snakemake.output.json,
    output_md=snakemake.output.markdown,
    parity_floors=params.parity_floors,
    gateway=params.gateway,
)
