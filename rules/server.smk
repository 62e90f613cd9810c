# Server targets without outputs run every time: each checks the real server, not a stale file.
rule status:
    params:
        server=CFG["server"],
        models=MODELS,
        work=WORK,
        repository=REPOSITORY,
    log:
        "results/logs/status.log",
    localrule: True
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/status.py"


rule stop:
    params:
        server=CFG["server"],
        models=MODELS,
        work=WORK,
        repository=REPOSITORY,
    log:
        "results/logs/stop.log",
    localrule: True
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/stop.py"
