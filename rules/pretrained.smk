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
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/pretrained.py"
