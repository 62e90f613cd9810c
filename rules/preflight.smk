# Cheap host checks (stub, disk, GPU, ports, memory). Highest priority: with --cores 1 it runs before
# any fetch, so a host problem stops the run before downloads. Only validate depends on it, so a
# changed port never triggers refetching.
rule preflight:
    output:
        results("preflight.json"),
    params:
        models=preflight_models(),
        server=SERVER,
        work=WORK,
        pretrained={name: pretrained_dir(name) for name in MODELS},
        gpu=GPU_AVAILABLE,
        gateway=GATEWAY_EXPOSURE,  # a gateway beyond loopback without its API key: refused before any download
    log:
        logs("preflight", per_model=False),
    priority: 100
    localrule: True
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/preflight.py"
