"""Kubernetes manifests for the published repository (rule k8s): replicas of the official Triton container serving
`s3://BUCKET/PREFIX/model_repository` straight from object storage, the OpenAI gateway in front of them, and the same
repository as a KServe InferenceService.

`manifests` is a pure function of plain arguments (specs, URL, settings) returning the documents per file;
`render_k8s` writes them; `k8s_step` reads the published manifest.json first (the Triton version it was validated
with picks the container, its file sizes size the memory). No secret value is ever written: the S3 credentials and
the API keys are referenced by Secret name (README.md in the output says how to create them).

Resources, per replica (documented in the rendered README.md as well):
- cpu request: 500m for the server + 1 core per model instance (each instance is a Python stub process that
  runs its own forward passes); no cpu limit (a limit throttles latency, a request is what scheduling needs).
- memory request: 1 GiB for the server + per instance (the model's published bytes + 512 MiB for the stub, its
  interpreter, tokenizer and activations); the limit is twice that (loading copies weights once; KV caches grow).
- /dev/shm: a memory-backed emptyDir of 256 MiB per instance (the stubs exchange tensors through shared memory;
  Kubernetes gives a container 64 MiB by default).
- `nvidia.com/gpu: N` when any model has `device: gpu`: N = the GPUs the published repository's instance groups and
  vllm engines name (manifest.json `gpus`: highest index + 1, as the pod numbers its GPUs from 0), or without that
  record the GPUs the specs name (`gpus` lists, a vllm engine's tensor x pipeline parallel span; `all` and the
  default: 1).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as metadata_version
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from hf2triton.deploy.publish import REPOSITORY_PREFIX, split_url
from hf2triton.errors import UserError
from hf2triton.fsutil import atomic_directory
from hf2triton.specs import ModelSpec, OpenAISpec, ProjectSpec, ServerSpec, from_param
from hf2triton.triton.settings import RESTRICTED_HTTP_APIS, RESTRICTED_KEY_HEADER

# Triton version -> NGC container release. The nvidia-pytriton 0.7.0 wheel that `make serve` validates with bundles
# tritonserver 2.51.0, which NVIDIA ships as the 24.10 container: same server, same Python backend (its stub is
# Python 3.10 there: hf2triton.deploy.execenv). A repository is deployed only on the release it was validated on.
TRITON_RELEASES = {"2.51.0": "24.10"}
WHEEL_TRITON = "2.51.0"
TRITON_IMAGE = "nvcr.io/nvidia/tritonserver"
PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}  # the container's, whatever server.* says for `make serve`
QUEUE_METRIC = "nv_inference_queue_duration_us"
FILES = ("triton.yaml", "gateway.yaml", "kserve.yaml")
GiB, MiB = 1 << 30, 1 << 20


def package_version() -> str:
    try:
        return metadata_version("hf2triton")
    except PackageNotFoundError:  # a checkout that was not installed
        return "dev"


HF2TRITON_VERSION = package_version()
# A DNS-1035 label (Services need it) short enough for the longest suffix we add ("-gateway")
NAME = re.compile(r"^[a-z]([-a-z0-9]{0,45}[a-z0-9])?$")
SECRET = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # a DNS-1123 subdomain
SERVER = ServerSpec()  # server settings the container takes from the config (shm size, log level, startup time)
IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")


@dataclass(frozen=True)
class K8sSpec:
    """How the manifests are named and scaled (not the models: those are the config's)."""

    name: str = "hf2triton"
    namespace: str = ""  # "": whatever `kubectl apply -n` says
    s3_secret: str = "hf2triton-s3"  # noqa: S105 - a Secret's name; keys AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY
    keys_secret: str = "hf2triton-keys"  # noqa: S105 - a Secret's name; keys admin-key, client-key (Triton's restricted APIs), api-key (gateway)
    region: str = "us-east-1"
    endpoint_url: str = ""  # an S3-compatible server; "": AWS
    gateway_image: str = f"hf2triton:{HF2TRITON_VERSION}"  # an image with hf2triton installed (README.md)
    min_replicas: int = 1
    max_replicas: int = 4
    queue_target_us: int = 50_000  # average queue time per request a replica may have before the HPA adds one


def check_spec(k8s: K8sSpec) -> None:
    if not NAME.match(k8s.name):
        raise UserError(f"k8s name {k8s.name!r} is not a DNS label of at most 47 characters", "use lowercase letters, digits and '-'")
    if k8s.namespace and not NAME.match(k8s.namespace):
        raise UserError(f"k8s namespace {k8s.namespace!r} is not a DNS label", "use lowercase letters, digits and '-'")
    for secret in (k8s.s3_secret, k8s.keys_secret):
        if not SECRET.match(secret):
            raise UserError(f"k8s secret name {secret!r} is not a DNS subdomain", "use lowercase letters, digits, '-' and '.'")
    if not IMAGE.match(k8s.gateway_image):
        raise UserError(f"gateway image {k8s.gateway_image!r} is not an image reference", "e.g. registry.example/hf2triton:0.1.0")
    if not 1 <= k8s.min_replicas <= k8s.max_replicas:
        raise UserError(f"replicas {k8s.min_replicas}..{k8s.max_replicas}: not a range", "1 <= min_replicas <= max_replicas")


def triton_release(version: str) -> str:
    if version not in TRITON_RELEASES:
        raise UserError(
            f"no official container is known for Triton {version} (known: {', '.join(TRITON_RELEASES)})",
            "publish from a server of a known version, or add its release to TRITON_RELEASES",
        )
    return TRITON_RELEASES[version]


def repository_url(storage_url: str, endpoint_url: str = "") -> str:
    """The published repository as Triton's --model-repository: s3://bucket/prefix/model_repository, or for an
    S3-compatible server s3://http[s]://host:port/bucket/... (Triton's form; it needs the port)."""
    bucket, prefix = split_url(storage_url)
    path = "/".join(p for p in (bucket, prefix, REPOSITORY_PREFIX) if p)
    if not endpoint_url:
        return f"s3://{path}"
    endpoint = urlparse(endpoint_url)
    if endpoint.scheme not in ("http", "https") or not endpoint.hostname or endpoint.path.strip("/"):
        raise UserError(f"endpoint {endpoint_url!r} is not http(s)://host[:port]", "e.g. https://minio.example:9000")
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    return f"s3://{endpoint.scheme}://{endpoint.hostname}:{port}/{path}"


def quantity(size: int) -> str:
    """Bytes as a Kubernetes quantity, rounded up to whole MiB."""
    return f"{-(-size // MiB)}Mi"


def pod_gpus(models: Sequence[ModelSpec], published: int | None = None) -> int:
    """The GPUs a replica asks for: the published record (`published`), else what the GPU models' specs name."""
    if published:
        return published
    named = [max(m.gpus) + 1 if isinstance(m.gpus, tuple) else m.gpu_span for m in models if m.device == "gpu"]
    return max(named, default=0)


def resources(models: Sequence[ModelSpec], model_bytes: Mapping[str, int], gpus: int | None = None) -> dict[str, Any]:
    """Per replica (module docstring: why these numbers); `gpus`: the published repository's GPU count."""
    instances = sum(m.instances for m in models)
    memory = GiB + sum(m.instances * (model_bytes.get(m.name, 0) + 512 * MiB) for m in models)
    spec: dict[str, Any] = {
        "requests": {"cpu": f"{500 + 1000 * instances}m", "memory": quantity(memory)},
        "limits": {"memory": quantity(2 * memory)},
    }
    if any(m.device == "gpu" for m in models):
        spec["limits"]["nvidia.com/gpu"] = pod_gpus(models, gpus)
    return spec


def labels(k8s: K8sSpec, component: str, version: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "hf2triton",
        "app.kubernetes.io/instance": k8s.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/version": version,
        "app.kubernetes.io/part-of": "hf2triton",
        "app.kubernetes.io/managed-by": "hf2triton",
    }


def metadata(k8s: K8sSpec, name: str, component: str, version: str, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels(k8s, component, version), **extra}
    if k8s.namespace:
        meta["namespace"] = k8s.namespace
    return meta


def selector(k8s: K8sSpec, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "hf2triton", "app.kubernetes.io/instance": k8s.name, "app.kubernetes.io/component": component}


def secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def restricted_flags() -> list[str]:
    """The same API restrictions as `make serve` (hf2triton.triton.settings), the keys expanded by the kubelet from
    the container's environment ($(VAR)): the manifest holds only the Secret's name."""
    from hf2triton.triton import client

    admin = f"{RESTRICTED_HTTP_APIS}:{RESTRICTED_KEY_HEADER}=$(HF2TRITON_ADMIN_KEY)"
    clients = f"{client.CLIENT_KEY_APIS}:{client.KEY_HEADER}=$(HF2TRITON_CLIENT_KEY)"
    return [f"--{flag}={value}" for value in (admin, clients) for flag in ("http-restricted-api", "grpc-restricted-protocol")]


def probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "failureThreshold": failures}


def hardened() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def triton_documents(
    models: Sequence[ModelSpec],
    repository: str,
    k8s: K8sSpec,
    server: ServerSpec,
    release: str,
    model_bytes: Mapping[str, int],
    gpus: int | None = None,
) -> list[dict[str, Any]]:
    name, version = f"{k8s.name}-triton", f"{release}-py3"
    instances = sum(m.instances for m in models)
    args = [
        "tritonserver",
        f"--model-repository={repository}",
        *[f"--{key}-port={port}" for key, port in PORTS.items()],
        f"--backend-config=python,shm-default-byte-size={server.shm_default_byte_size}",
        f"--log-verbose={server.log_verbose}",
        *restricted_flags(),
    ]
    env = [
        secret_env("AWS_ACCESS_KEY_ID", k8s.s3_secret, "AWS_ACCESS_KEY_ID"),
        secret_env("AWS_SECRET_ACCESS_KEY", k8s.s3_secret, "AWS_SECRET_ACCESS_KEY"),
        {"name": "AWS_DEFAULT_REGION", "value": k8s.region},  # not a secret
        secret_env("HF2TRITON_ADMIN_KEY", k8s.keys_secret, "admin-key"),
        secret_env("HF2TRITON_CLIENT_KEY", k8s.keys_secret, "client-key"),
    ]
    container = {
        "name": "tritonserver",
        "image": f"{TRITON_IMAGE}:{version}",
        "args": args,  # the image's entrypoint (NVIDIA's banner and checks) runs them
        "env": env,
        "ports": [{"name": key, "containerPort": port} for key, port in PORTS.items()],
        # loading from S3 takes a while: the startup probe allows server.startup_timeout_s before liveness counts
        "startupProbe": probe("/v2/health/live", 10, max(1, server.startup_timeout_s // 10)),
        "livenessProbe": probe("/v2/health/live", 10, 3),
        "readinessProbe": probe("/v2/health/ready", 5, 2),
        "resources": resources(models, model_bytes, gpus),
        "securityContext": hardened(),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],  # noqa: S108 - the pod's own shared memory
    }
    pod_labels = {**labels(k8s, "triton", version), **selector(k8s, "triton")}
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": str(PORTS["metrics"]), "prometheus.io/path": "/metrics"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(k8s, name, "triton", version),
        "spec": {
            "replicas": k8s.min_replicas,
            "selector": {"matchLabels": selector(k8s, "triton")},
            "template": {
                "metadata": {"labels": pod_labels, "annotations": scrape},
                "spec": {
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": quantity(instances * 256 * MiB)}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(k8s, name, "triton", version),
        "spec": {
            "selector": selector(k8s, "triton"),
            "ports": [{"name": key, "port": port, "targetPort": key, "protocol": "TCP"} for key, port in PORTS.items()],
        },
    }
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(k8s, name, "triton", version),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": k8s.min_replicas,
            "maxReplicas": k8s.max_replicas,
            # a Pods metric: served by a Prometheus adapter from Triton's counter (README.md has the rule)
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": QUEUE_METRIC},
                        "target": {"type": "AverageValue", "averageValue": str(k8s.queue_target_us)},
                    },
                }
            ],
        },
    }
    return [deployment, service, hpa]


def gateway_documents(models: Sequence[ModelSpec], openai: OpenAISpec, k8s: K8sSpec, version: str) -> list[dict[str, Any]]:
    from hf2triton.gateway.process import command
    from hf2triton.triton.settings import Settings

    name, triton = f"{k8s.name}-gateway", f"{k8s.name}-triton"
    domain = f".{k8s.namespace}.svc" if k8s.namespace else ""
    # Host names the gateway answers under besides IP literals (the kubelet's probes): its Service's, and the config's
    served_as = [name, *([f"{name}.{k8s.namespace}", f"{name}{domain}", f"{name}{domain}.cluster.local"] if k8s.namespace else [])]
    wanted = dataclasses.replace(openai, host="0.0.0.0", allowed_hosts=(*served_as, *openai.allowed_hosts))  # noqa: S104 - a pod's own address
    triton_server = ServerSpec(host=f"{triton}{domain}", grpc_port=PORTS["grpc"])
    argv = command(Settings(triton_server, "/", "/", [m.name for m in models]), wanted)
    key_dir = "/var/run/hf2triton"
    container = {
        "name": "gateway",
        "image": k8s.gateway_image,
        "command": ["python", *argv[1:]],  # the same command line `make serve` starts
        "env": [
            secret_env(openai.api_key_env, k8s.keys_secret, "api-key"),
            {"name": "HF2TRITON_KEY_FILE", "value": f"{key_dir}/client-key"},  # Triton's client key (hf2triton.triton.client)
        ],
        "ports": [{"name": "http", "containerPort": openai.port}],
        "readinessProbe": probe("/health", 5, 2),  # 503 while Triton is not ready
        "livenessProbe": {
            "tcpSocket": {"port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },  # a Triton outage is no reason to restart
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {**hardened(), "readOnlyRootFilesystem": True},
        "volumeMounts": [{"name": "keys", "mountPath": key_dir, "readOnly": True}],
    }
    keys = {
        "secretName": k8s.keys_secret,
        "items": [{"key": "client-key", "path": "client-key"}],
        "defaultMode": 0o440,
    }  # group fsGroup: the non-root user reads it
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(k8s, name, "gateway", version),
        "spec": {
            "replicas": 2,  # stateless: two for availability
            "selector": {"matchLabels": selector(k8s, "gateway")},
            "template": {
                "metadata": {"labels": {**labels(k8s, "gateway", version), **selector(k8s, "gateway")}},
                "spec": {
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 10001,
                        "fsGroup": 10001,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [{"name": "keys", "secret": keys}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(k8s, name, "gateway", version),
        "spec": {
            "selector": selector(k8s, "gateway"),
            "ports": [{"name": "http", "port": openai.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    return [deployment, service]


def kserve_documents(
    models: Sequence[ModelSpec], storage_url: str, k8s: K8sSpec, release: str, model_bytes: Mapping[str, int], gpus: int | None = None
) -> list[dict[str, Any]]:
    """KServe's Triton runtime pulls the repository with its storage initializer, with the credentials of the
    ServiceAccount's Secret (for an S3-compatible server, annotate that Secret: README.md)."""
    version = f"{release}-py3"
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(k8s, f"{k8s.name}-kserve", "kserve", version),
        "secrets": [{"name": k8s.s3_secret}],
    }
    bucket, prefix = split_url(storage_url)
    isvc = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": metadata(k8s, k8s.name, "kserve", version),
        "spec": {
            "predictor": {
                "serviceAccountName": f"{k8s.name}-kserve",
                "minReplicas": k8s.min_replicas,
                "maxReplicas": k8s.max_replicas,
                "triton": {
                    "storageUri": "s3://" + "/".join(p for p in (bucket, prefix, REPOSITORY_PREFIX) if p),
                    "runtimeVersion": version,
                    "env": [{"name": "AWS_DEFAULT_REGION", "value": k8s.region}],
                    "resources": resources(models, model_bytes, gpus),
                },
            }
        },
    }
    return [account, isvc]


def as_models(models: Sequence[ModelSpec] | ProjectSpec) -> tuple[ModelSpec, ...]:
    found = tuple(models.models if isinstance(models, ProjectSpec) else models)
    if not found:
        raise UserError("no models to deploy", "add models to config.yaml")
    return found


def manifests(
    models: Sequence[ModelSpec] | ProjectSpec,
    storage_url: str,
    gateway: OpenAISpec | None = None,
    k8s: K8sSpec = K8sSpec(),
    server: ServerSpec = SERVER,
    model_bytes: Mapping[str, int] | None = None,
    triton_version: str = WHEEL_TRITON,
    gpus: int | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """file name -> its documents. `gateway`: the OpenAI gateway's settings (None or not enabled: no gateway.yaml);
    `model_bytes`: each model's published size (manifest.json; sizes the memory requests); `gpus`: the GPUs the
    published repository names (manifest.json; None: from the specs)."""
    specs = as_models(models)
    check_spec(k8s)
    release = triton_release(triton_version)
    sizes = dict(model_bytes or {})
    out = {
        "triton.yaml": triton_documents(specs, repository_url(storage_url, k8s.endpoint_url), k8s, server, release, sizes, gpus),
        "kserve.yaml": kserve_documents(specs, storage_url, k8s, release, sizes, gpus),
    }
    if gateway is not None and gateway.enabled:
        out["gateway.yaml"] = gateway_documents(specs, gateway, k8s, HF2TRITON_VERSION)
    return {name: out[name] for name in FILES if name in out}


README = """# Kubernetes manifests for {url}

Rendered by hf2triton (rule k8s); edits are overwritten. Apply with `kubectl apply -f <this directory>`.

- `triton.yaml`: Deployment + Service + HorizontalPodAutoscaler of `{image}` serving `{repository}`.
- `gateway.yaml` (when openai.enabled): the OpenAI-compatible gateway (image `{gateway_image}`: build one with
  hf2triton installed) in front of the Triton Service.
- `kserve.yaml`: the same repository as a KServe InferenceService (Triton runtime {release}-py3) + its ServiceAccount.

Create the Secrets first (values never go into these files):

    kubectl create secret generic {s3_secret} --from-literal=AWS_ACCESS_KEY_ID=... --from-literal=AWS_SECRET_ACCESS_KEY=...
    kubectl create secret generic {keys_secret} --from-literal=admin-key=$(openssl rand -hex 24) \\
        --from-literal=client-key=$(openssl rand -hex 24) --from-literal=api-key=$(openssl rand -hex 24)

Clients of Triton's own ports send `hf2triton-key: <client-key>`; clients of the gateway `Authorization: Bearer <api-key>`.
For KServe and an S3-compatible server, annotate {s3_secret} with `serving.kserve.io/s3-endpoint` (and `s3-usehttps`).

Autoscaling: the HPA reads the Pods metric `{metric}` (target: {target} us average per replica). Triton exports it
as a counter on port 8002 (the pods carry prometheus.io/scrape annotations); a Prometheus adapter must serve it as
the average queue time per request, e.g. the rule
`seriesQuery: '{metric}{{namespace!="",pod!=""}}'`, `name: {{as: "{metric}"}}`,
`metricsQuery: 'sum(rate({metric}{{<<.LabelMatchers>>}}[1m])) by (<<.GroupBy>>)
/ clamp_min(sum(rate(nv_inference_request_success{{<<.LabelMatchers>>}}[1m])) by (<<.GroupBy>>), 1)'`.
Without an adapter the HPA reports the metric as unavailable and keeps {min_replicas} replica(s).

Python models need their packages in the official container: publish them with a packed execution environment
(hf2triton.deploy.execenv: Python 3.10 for {release}).
"""


def render_k8s(
    models: Sequence[ModelSpec] | ProjectSpec,
    storage_url: str,
    output: Path | str,
    gateway: OpenAISpec | None = None,
    k8s: K8sSpec = K8sSpec(),
    server: ServerSpec = SERVER,
    model_bytes: Mapping[str, int] | None = None,
    triton_version: str = WHEEL_TRITON,
    gpus: int | None = None,
) -> list[Path]:
    """Write the manifests (one YAML stream per file, keys in a fixed order) and a README.md into `output`
    (replaced as a whole); returns the YAML files."""
    documents = manifests(models, storage_url, gateway, k8s, server, model_bytes, triton_version, gpus)
    release = triton_release(triton_version)
    with atomic_directory(output) as tmp:
        for name, docs in documents.items():
            (tmp / name).write_text(yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, explicit_start=True))
        (tmp / "README.md").write_text(
            README.format(
                url=storage_url,
                image=f"{TRITON_IMAGE}:{release}-py3",
                repository=repository_url(storage_url, k8s.endpoint_url),
                gateway_image=k8s.gateway_image,
                release=release,
                s3_secret=k8s.s3_secret,
                keys_secret=k8s.keys_secret,
                metric=QUEUE_METRIC,
                target=k8s.queue_target_us,
                min_replicas=k8s.min_replicas,
            )
        )
    return [Path(output) / name for name in documents]


def k8s_step(manifest: str, output: str, models: list[dict], openai: dict, server: dict, url: str, k8s: dict) -> list[Path]:
    """Rule k8s: the specs arrive as params dicts (hf2triton.specs.to_param); the published manifest.json says
    which Triton validated the repository and how large each model is."""
    published = json.loads(Path(manifest).read_text())
    if not published.get("validation", {}).get("ok"):
        raise UserError(f"{url} was published from a server whose validation failed", "fix the models and `make publish` again")
    specs = [from_param(ModelSpec, m) for m in models]
    missing = sorted({m.name for m in specs} - set(published["models"]))
    if missing:
        raise UserError(f"models {', '.join(missing)} are not in the published repository {url}", "run `make publish` first")
    sizes = {name: sum(f["size"] for f in entry["files"].values()) for name, entry in published["models"].items()}
    version = published.get("triton") or WHEEL_TRITON
    gateway, server_spec = from_param(OpenAISpec, openai), from_param(ServerSpec, server)
    return render_k8s(specs, url, output, gateway, K8sSpec(**k8s), server_spec, sizes, version, published.get("gpus"))
