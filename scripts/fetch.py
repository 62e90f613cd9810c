"""Snakemake adapter for rule fetch (logic: hf2triton.fetch.fetch_source)."""

from hf2triton.fetch import fetch_source
from hf2triton.steps import run_step

params = snakemake.params
run_step(
    snakemake,
    fetch_source,
    source=params.source,
    revision=params.revision,
    gguf_file=params.gguf_file,
    cache_dir=params.cache_dir,
    output=snakemake.output.record,
)
