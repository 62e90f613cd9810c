"""Snakemake adapter for rule bench (logic: hf2triton.benchreport.write_bench_report)."""

from pathlib import Path

from hf2triton.benchreport import write_bench_report
from hf2triton.steps import run_step

run_step(
    snakemake,
    write_bench_report,
    results=list(snakemake.input),
    output_md=snakemake.output.markdown,
    output_summary=snakemake.output.summary,
    plot_dir=str(Path(snakemake.output.plots[0]).parent),
)
