# hf2triton: Hugging Face model -> validated, running Triton Inference Server, without Docker.
# This file is the table of contents; rules live in rules/<stage>.smk in data-flow order and the
# logic in the hf2triton package. Usage: snakemake --cores 1 serve   (see README.md)
from snakemake.utils import min_version

min_version("9.0")


include: "rules/common.smk"


wildcard_constraints:
    model="|".join(re.escape(name) for name in MODELS),


include: "rules/preflight.smk"
include: "rules/fetch.smk"
include: "rules/pretrained.smk"
include: "rules/export.smk"
include: "rules/repository.smk"
include: "rules/validate.smk"
include: "rules/server.smk"
include: "rules/bench.smk"
include: "rules/publish.smk"


# The default target: everything through validation, then make sure the server is up and current.
rule serve:
    input:
        rules.validate.output.json,
        # what gets served: a wiped saved model, export or rendered directory is rebuilt (Snakemake rebuilds a missing
        # file only for a job that runs: this one always does), not found missing by the server
        repository=expand(rules.repository.output[0], model=MODELS),
        built=[path for label, path in BUILT.items() if not label.endswith(":repository")],
    params:
        server=SERVER,
        models=MODELS,
        work=work_of,
        repository=repository_of,
        openai=to_param(PROJECT.openai),
        gateway_report=results("validation/gateway"),
    log:
        logs("serve", per_model=False),
    localrule: True
    conda:
        "envs/hf2triton.yaml"
    script:
        "scripts/serve.py"
