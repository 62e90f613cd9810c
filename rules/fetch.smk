# Source -> local files + a record of exactly what they are (resolved commit, sizes, sha256).
rule fetch:
    input:
        local_source,
    output:
        record=fetch_record(),
    params:
        source=model_value("source"),
        source_version=source_version,
        revision=model_value("revision"),
        gguf_file=model_value("gguf_file"),
        cache_dir=hub_cache(),
    log:
        logs("fetch"),
    retries: 1
    threads: 1
    # What an executor (--executor slurm: profiles/slurm) books per job; a local run only counts them.
    # Constants sized for models up to ~1.5B parameters (docs/beyond-one-machine.md, "Build on a cluster"): override per
    # rule with --set-resources RULE:mem_mb=... / --set-threads RULE=N for larger ones.
    resources:
        mem_mb=2000,
        runtime=120,
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/fetch.py"
