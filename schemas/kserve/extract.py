"""Regenerate inferenceservice.v1beta1.json from KServe's CRD (see README.md here):

python schemas/kserve/extract.py serving.kserve.io_inferenceservices.yaml schemas/kserve/inferenceservice.v1beta1.json
"""

import json
import sys

import yaml

# What hf2triton renders uses none of these: left out to keep the vendored file small (a manifest using them is refused).
DROPPED_SPEC = ("explainer", "transformer")
DROPPED_PREDICTOR = ("huggingface", "lightgbm", "model", "onnx", "paddle", "pmml", "pytorch", "sklearn", "tensorflow")
DROPPED_PREDICTOR += ("workerSpec", "xgboost")


def without_descriptions(node):
    if isinstance(node, dict):
        return {k: without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [without_descriptions(v) for v in node]
    return node


def extract(crd: dict) -> dict:
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1beta1")
    schema = without_descriptions(version["schema"]["openAPIV3Schema"])
    schema["properties"].pop("status")
    spec = schema["properties"]["spec"]["properties"]
    for name in DROPPED_SPEC:
        spec.pop(name)
    for name in DROPPED_PREDICTOR:
        spec["predictor"]["properties"].pop(name)
    return schema


if __name__ == "__main__":
    source, target = sys.argv[1:]
    with open(source) as handle:
        schema = extract(yaml.safe_load(handle))
    with open(target, "w") as handle:
        json.dump(schema, handle, sort_keys=True, separators=(",", ":"))
        handle.write("\n")
