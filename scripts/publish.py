"""Snakemake adapter for rule publish (logic: hf2triton.deploy.publish.publish_step)."""

from hf2triton.deploy.publish import publish_step
from hf2triton.pipeline.steps import run_step

run_step(
    snakemake,
    publish_step,
    url=snakemake.params.url,
    models=dict(zip(snakemake.params.get("models", []), snakemake.input.get("models", []), strict=True)),
    validation_json=snakemake.input.get("validation", ""),
    validation_md=snakemake.input.get("markdown", ""),
    output=snakemake.output.get("manifest", ""),
    output_md=snakemake.output.get("markdown", ""),
)
