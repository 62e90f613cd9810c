"""Snakemake adapter for rule execution_env (logic: hf2triton.deploy.execenv.execution_env_step)."""

from hf2triton.deploy.execenv import execution_env_step
from hf2triton.pipeline.steps import run_step

run_step(
    snakemake,
    execution_env_step,
    requirements=snakemake.input.requirements,
    output=snakemake.output[0],
    python=snakemake.params.python,
    target_python=snakemake.params.target_python,
)
