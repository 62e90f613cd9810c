"""Snakemake adapter for rule tune (logic: hf2triton.tune.tune_models)."""

from pathlib import Path

from hf2triton.steps import run_step
from hf2triton.tune import tune_models

artifacts = {}
for key, path in snakemake.input.items():
    if "__" in key:
        name, kind = key.rsplit("__", 1)
        artifacts.setdefault(name, {})[kind] = path
run_step(
    snakemake,
    tune_models,
    models=snakemake.params.models,
    artifacts=artifacts,
    server=snakemake.params.server,
    tune=snakemake.params.tune,
    output_overlay=snakemake.output.overlay,
    output_json=snakemake.output.json,
    output_md=snakemake.output.markdown,
    plot_dir=str(Path(snakemake.output.markdown).parent / "plots"),
)
