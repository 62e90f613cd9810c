# Fetched files -> transformers save_pretrained (model + tokenizer): what the server loads.
rule pretrained:
    input:
        record=rules.fetch.output.record,
    output:
        directory(pretrained_dir()),
    params:
        task=model_value("task"),
    log:
        logs("pretrained"),
    threads: 2
    # What an executor books per job (see rule fetch): the model loaded and saved once.
    resources:
        mem_mb=8000,
        runtime=60,
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/pretrained.py"
