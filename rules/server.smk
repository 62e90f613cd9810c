# Server targets without outputs run every time: each checks the real server, not a stale file.
rule status:
    params:
        server=SERVER,
        models=MODELS,
        work=WORK,
        repository=REPOSITORY,
        openai=to_param(PROJECT.openai),
        built=BUILT,
        validation=results("validation/report.json"),
    log:
        logs("status", per_model=False),
    localrule: True
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/status.py"


rule stop:
    params:
        server=SERVER,
        models=MODELS,
        work=WORK,
        repository=REPOSITORY,
    log:
        logs("stop", per_model=False),
    localrule: True
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/stop.py"
