# Saved model -> model_repository/<model>/{config.pbtxt,1/model.py}, then a static lint of it.
rule repository:
    input:
        unpack(repository_inputs),
    output:
        directory(f"{REPOSITORY}/{{model}}"),
    params:
        task=model_value("task"),
        max_batch_size=model_value("max_batch_size"),
        instances=model_value("instances"),
        kind=instance_kind,
        dtype=model_value("dtype"),
        num_threads=threads_per_instance,
        max_queue_delay_us=queue_delay_us,
        max_input_bytes=model_value("max_input_bytes"),
        generation=generation_options,
        backend=model_value("backend"),
    log:
        "results/logs/repository/{model}.log",
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/repository.py"


rule lint:
    input:
        rules.repository.output[0],
    output:
        "results/lint/{model}.json",
    params:
        gpu=GPU_AVAILABLE,
    log:
        "results/logs/lint/{model}.log",
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/lint.py"
