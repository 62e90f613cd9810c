"""Snakemake adapter for rule bench_model (logic: hf2triton.perf.bench.bench_model_step)."""

from hf2triton.perf.bench import bench_model_step
from hf2triton.pipeline.steps import run_step

params = snakemake.params
run_step(
    snakemake,
    bench_model_step,
    name=snakemake.wildcards.model,
    server=params.server,
    models=params.models,
    work=params.work,
    repository=params.repository,
    bench=params.bench,
    model=params.model,
    openai=params.openai,
    output_json=snakemake.output.json,
    scratch=snakemake.output.scratch,
)
