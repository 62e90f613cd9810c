"""Snakemake adapter for rule fetch (logic: hf2triton.pipeline.fetch.fetch_step)."""

from hf2triton.pipeline.fetch import fetch_step
from hf2triton.pipeline.steps import run_step

params = snakemake.params
run_step(
    snakemake,
    fetch_step,
    source=params.source,
    revision=params.revision,
    gguf_file=params.gguf_file,
    cache_dir=params.cache_dir,
    output=snakemake.output.record,
)
