"""Snakemake adapter for rule tune (logic: hf2triton.perf.tune.tune_step)."""

from pathlib import Path

from hf2triton.perf.tune import tune_step
from hf2triton.pipeline.steps import run_step

run_step(
    snakemake,
    tune_step,
    models=snakemake.params.models,
    inputs=dict(snakemake.input.items()),
    server=snakemake.params.server,
    tune=snakemake.params.tune,
    gpu_available=snakemake.params.gpu,
    output_overlay=snakemake.output.overlay,
    output_json=snakemake.output.json,
    output_md=snakemake.output.markdown,
    scratch_dir=snakemake.output.scratch,
    plot_dir=str(Path(snakemake.output.plots[0]).parent)
    if snakemake.output.plots
    else str(Path(snakemake.output.markdown).parent / "plots"),
)
