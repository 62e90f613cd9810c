"""Snakemake adapter for rule publish_model (logic: hf2triton.deploy.publish.publish_model_step)."""

from hf2triton.deploy.publish import publish_model_step
from hf2triton.pipeline.steps import run_step

run_step(
    snakemake,
    publish_model_step,
    model_dir=snakemake.input.repository,
    output=snakemake.output[0],
    project_dir=snakemake.params.project_dir,
    work=snakemake.params.work,
    execution_env=snakemake.input.get("execution_env", ""),
)
