"""Snakemake adapter for rule preflight (logic: hf2triton.pipeline.preflight.preflight_step)."""

from hf2triton.pipeline.preflight import preflight_step
from hf2triton.pipeline.steps import run_step

params = snakemake.params
run_step(
    snakemake,
    preflight_step,
    models=params.models,
    server=params.server,
    work=params.work,
    pretrained_dirs=params.pretrained,
    gpu_available=params.gpu,
    gateway=params.gateway,
    output=snakemake.output[0],
)
