"""Snakemake adapter for rule bench_model (logic: hf2triton.bench.bench_model)."""

from hf2triton.bench import bench_model
from hf2triton.steps import run_step

params = snakemake.params
run_step(
    snakemake,
    bench_model,
    name=snakemake.wildcards.model,
    server=params.server,
    models=params.models,
    work=params.work,
    repository=params.repository,
    bench=params.bench,
    output_json=snakemake.output[0],
)
