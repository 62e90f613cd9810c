"""Snakemake adapter for rule k8s (logic: hf2triton.deploy.k8s.k8s_step)."""

from hf2triton.deploy.k8s import k8s_step
from hf2triton.pipeline.steps import run_step

run_step(
    snakemake,
    k8s_step,
    manifest=snakemake.input.manifest,
    output=snakemake.output[0],
    models=snakemake.params.models,
    openai=snakemake.params.openai,
    server=snakemake.params.server,
    url=snakemake.params.url,
    k8s=snakemake.params.k8s,
)
