# Lint-clean repository -> a running, current server (started or restarted as needed) -> report.
rule validate:
    input:
        preflight=rules.preflight.output[0],
        lint=expand(rules.lint.output[0], model=MODELS),
        repository=expand(rules.repository.output[0], model=MODELS),
    output:
        json=results("validation/report.json"),
        markdown=results("validation/report.md"),
    params:
        server=SERVER,
        models=MODELS,
        work=WORK,
        repository=repository_of,
        parity_floors={model.name: model.onnx.parity_floor for model in PROJECT.models},
        gateway=GATEWAY_EXPOSURE,  # the key policy: refused before the server is touched
    log:
        logs("validate", per_model=False),
    localrule: True
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/validate.py"
