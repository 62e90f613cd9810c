# Measurement targets (not part of `serve`): bench = load tests of the served models next to the in-process
# engine; tune = a sweep on a scratch server that writes a config overlay. Both only target 127.0.0.1.
rule bench_model:
    input:
        validated=rules.validate.output.json,
        repository=repository_dir(),
    output:
        json=results("bench/{model}.json"),
        scratch=directory(results("bench/scratch/{model}")),
    params:
        server=SERVER,
        models=MODELS,
        work=WORK,
        repository=repository_of,
        bench=to_param(PROJECT.bench),
        model=lambda wildcards: to_param(PROJECT.model(wildcards.model)),
        openai=to_param(PROJECT.openai),
    log:
        logs("bench"),
    localrule: True
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/bench_model.py"


rule bench:
    input:
        expand(rules.bench_model.output.json, model=MODELS),
    output:
        markdown=results("bench/report.md"),
        summary=results("bench/summary/ratios.json"),
        plots=expand(results("bench/plots/{model}-{kind}.png"), model=MODELS, kind=["throughput", "latency"]),
    log:
        logs("bench_report", per_model=False),
    localrule: True
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/bench_report.py"


rule tune:
    input:
        unpack(tune_inputs),
    output:
        overlay=results("tune/overlay.yaml"),
        json=results("tune/results.json"),
        markdown=results("tune/report.md"),
        plots=expand(results("tune/plots/{model}-grid.png"), model=[m.name for m in PROJECT.tuned_models()]),
        scratch=directory(results("tune/scratch")),
    params:
        models=[to_param(model) for model in PROJECT.tuned_models()],
        server=SERVER,
        tune=to_param(PROJECT.tune),
        gpu=GPU_AVAILABLE,
    log:
        logs("tune", per_model=False),
    localrule: True
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/tune.py"
