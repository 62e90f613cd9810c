# Validated repository -> object storage (publish.url): each model as a portable directory (its weights inside, its
# paths relative), then a manifest. Replicas (`python -m hf2triton replica`) and Kubernetes serve it from there.
if PROJECT.publish.url:

    storage published:
        provider="s3",
        endpoint_url=PROJECT.publish.endpoint_url or None,
        region=PROJECT.publish.region,
        keep_local=True,

    if PROJECT.publish.execution_env:

        rule execution_env:  # the models' packages for the official container, packed once (hf2triton.deploy.execenv)
            input:
                requirements=PROJECT.publish.execution_env,
            output:
                execution_env_archive(),
            params:
                python=PROJECT.publish.execution_env_python,
                target_python=PROJECT.publish.execution_env_target,
            log:
                logs("execution_env", per_model=False),
            localrule: True
            resources:
                mem_mb=4000,
            conda:
                "../envs/hf2triton.yaml"
            script:
                "../scripts/execution_env.py"

    rule publish_model:
        input:
            unpack(publish_inputs),
        output:
            # a directory (the plugin uploads every file below it); Snakemake refuses directory() on storage
            storage.published(published_url("model_repository/{model}")),
        params:
            project_dir=workflow.basedir,
            work=WORK,
        log:
            logs("publish_model"),
        localrule: True
        conda:
            "../envs/hf2triton.yaml"
        script:
            "../scripts/publish_model.py"

    rule publish:
        input:
            models=[storage.published(published_url(f"model_repository/{name}")) for name in MODELS],
            validation=rules.validate.output.json,
            markdown=rules.validate.output.markdown,
        output:
            manifest=storage.published(published_url("manifest.json")),
            markdown=storage.published(published_url("validation.md")),
        params:
            url=PROJECT.publish.url,
            models=MODELS,
        log:
            logs("publish", per_model=False),
        localrule: True
        conda:
            "../envs/hf2triton.yaml"
        script:
            "../scripts/publish.py"

else:

    rule publish:  # nothing configured: stops at once with the fix, before any work
        params:
            url="",
        log:
            logs("publish", per_model=False),
        localrule: True
        conda:
            "../envs/hf2triton.yaml"
        script:
            "../scripts/publish.py"


# Published repository -> Kubernetes manifests: the official Triton container serving it from storage, the gateway,
# an autoscaler on queue time, and a KServe InferenceService variant (hf2triton.deploy.k8s).
if PROJECT.publish.url:

    rule k8s:
        input:
            manifest=storage.published(published_url("manifest.json")),
        output:
            directory(results("k8s")),
        params:
            models=[to_param(model) for model in PROJECT.models],
            openai=to_param(PROJECT.openai),
            server=SERVER,
            url=PROJECT.publish.url,
            k8s={"endpoint_url": PROJECT.publish.endpoint_url, "region": PROJECT.publish.region},
        log:
            logs("k8s", per_model=False),
        localrule: True
        conda:
            "../envs/hf2triton.yaml"
        script:
            "../scripts/k8s.py"

else:

    rule k8s:  # nothing published to render for: stops at once with the fix
        params:
            url="",
        log:
            logs("k8s", per_model=False),
        localrule: True
        conda:
            "../envs/hf2triton.yaml"
        script:
            "../scripts/publish.py"
