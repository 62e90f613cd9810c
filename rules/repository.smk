# Saved model -> model_repository/<model>/{config.pbtxt,1/model.py,1/interface.py}, then a static lint of it.
rule repository:
    input:
        unpack(repository_inputs),
    output:
        directory(repository_dir()),
    params:
        serving=serving,
    log:
        logs("repository"),
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/repository.py"


rule lint:
    input:
        rules.repository.output[0],
    output:
        results("lint/{model}.json"),
    params:
        gpu=GPU_AVAILABLE,
    log:
        logs("lint"),
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/lint.py"
