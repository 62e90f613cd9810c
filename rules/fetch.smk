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
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/fetch.py"
