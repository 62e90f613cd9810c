# Fetched files -> transformers save_pretrained (model + tokenizer): what the server loads.
rule pretrained:
    input:
        record=rules.fetch.output.record,
    output:
        directory(f"{WORK}/models/{{model}}/pretrained"),
    params:
        task=model_value("task"),
    log:
        "results/logs/pretrained/{model}.log",
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/pretrained.py"
