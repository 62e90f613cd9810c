"""Snakemake adapter for rule bench (logic: hf2triton.perf.report.bench_step)."""

from pathlib import Path

from hf2triton.perf.report import bench_step
from hf2triton.pipeline.steps import run_step

run_step(
    snakemake,
    bench_step,
    results=list(snakemake.input),
    output_md=snakemake.output.markdown,
    output_summary=snakemake.output.summary,
    plot_dir=str(Path(snakemake.output.plots[0]).parent),
)
