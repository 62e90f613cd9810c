"""Snakemake adapter for rule preflight (logic: hf2triton.preflight.run_preflight)."""

from hf2triton.preflight import run_preflight
from hf2triton.steps import run_step

params = snakemake.params
run_step(
    snakemake,
    run_preflight,
    cfg={"models": params.models, "server": params.server, "paths": {"work": params.work}},
    pretrained_dirs=params.pretrained,
    gpu_available=params.gpu,
    output=snakemake.output[0],
)
