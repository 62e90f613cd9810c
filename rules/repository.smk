# Saved model -> model_repository/<model>/{config.pbtxt,1/model.py,1/interface.py}, then a static lint of it.
rule repository:
    input:
        unpack(repository_inputs),
    output:
        # update(): Snakemake keeps it (and puts it back if the step refuses a config value) instead of deleting it
        # before the step; the step swaps the new directory in atomically. A rendered model is a few small files.
        update(directory(repository_dir())),
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
