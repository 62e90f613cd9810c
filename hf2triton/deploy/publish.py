"""Beyond one machine: the validated repository published to object storage, and replicas that serve it.

`publish_model_step` (rule publish_model) turns one rendered model into a **portable** model directory: its
config.pbtxt names its files relative to the version directory (`pretrained`, `onnx`, `tensorrt/engine.plan`,
resolved by model.py through ModelParameters.located), and the files themselves are inside it, so the directory
loads on any machine, from any path, and from Triton's own `s3://` repository support. A file manifest (sha256 of
every file, hf2triton.integrity) goes with it; no path of the building machine may appear in it. Snakemake's S3
storage plugin uploads the directory (rules/publish.smk).

`publish_step` (rule publish) writes the repository's manifest: versions, models, their file hashes and the
validation result. `fetch_published` brings a published repository to a replica's disk and verifies every hash;
`serve_replica` then starts a tritonserver of its own on it (its own ports and work directory) and validates it with
the same checks as `make serve`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from hf2triton.deploy.execenv import ENV_ARCHIVE, with_execution_env
from hf2triton.errors import UserError
from hf2triton.fsutil import atomic_directory, atomic_write_json
from hf2triton.integrity import MANIFEST, problems, write_manifest
from hf2triton.pipeline.render import VERSION
from hf2triton.triton.modelconfig import config_gpus, config_text, model_parameters, read_model_config

log = logging.getLogger(__name__)

REPOSITORY_PREFIX = "model_repository"  # below publish.url: a Triton model repository as is
PUBLISHED_MANIFEST = "manifest.json"  # at publish.url's root
# Where a portable model keeps what its parameters name, relative to its version directory.
PORTABLE_LAYOUT = {"model_dir": "pretrained", "onnx_dir": "onnx", "trt_engine": "tensorrt/engine.plan"}
TEXT_SUFFIXES = {".pbtxt", ".py", ".json", ".txt", ".md", ".yaml", ".yml", ".jinja", ".model"}
VERSIONED_PACKAGES = (
    "hf2triton",
    "torch",
    "transformers",
    "tokenizers",
    "onnxruntime",
    "onnxruntime-gpu",
    "tritonclient",
    "nvidia-pytriton",
)


def machine_paths(*paths: str) -> list[str]:
    """The absolute directories of this machine that must not appear in a published file (the project and work
    directories, the home directory)."""
    found = {str(Path(p).resolve()) for p in paths if p} | {str(Path.home())}
    return sorted(p for p in found if len(p) > 1)


def paths_inside(root: Path, forbidden: list[str]) -> list[str]:
    """'file: path' for every text file below `root` that names one of the `forbidden` paths."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in TEXT_SUFFIXES:
            text = path.read_text(encoding="utf-8", errors="replace")
            found += [f"{path.relative_to(root)}: {p}" for p in forbidden if p in text]
    return found


def portable_model(model_dir: str, output: str, forbidden: list[str], execution_env: str = "") -> dict[str, Any]:
    """Write the portable copy of one rendered model (`model_dir`) to `output`; returns its file manifest.
    `execution_env`: a packed environment (rule execution_env) copied in and named by EXECUTION_ENV_PATH."""
    config = read_model_config(Path(model_dir) / "config.pbtxt")
    params = model_parameters(config)
    if params.backend == "vllm":
        raise UserError(
            f"model {config.name}: backend vllm is not published yet (its EXECUTION_ENV_PATH names this machine's vLLM venv)",
            "publish the models with backend python or onnx, or serve backend vllm where its venv is built (make serve)",
        )
    copies = {}
    for key, relative in PORTABLE_LAYOUT.items():
        source = getattr(params, key)
        if source:
            copies[relative] = Path(source)
            config.parameters[key].string_value = relative
    with atomic_directory(output) as tmp:
        text = config_text(config)
        if execution_env:
            log.info("%s: with the execution environment %s", config.name, Path(execution_env).name)
            shutil.copyfile(execution_env, tmp / ENV_ARCHIVE)
            text = with_execution_env(text, ENV_ARCHIVE)
        (tmp / "config.pbtxt").write_text(text)
        shutil.copytree(Path(model_dir) / VERSION, tmp / VERSION, ignore=shutil.ignore_patterns("__pycache__"))
        for relative, source in copies.items():
            log.info("%s: copying %s into %s/%s", config.name, source, VERSION, relative)
            target = tmp / VERSION / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if source.is_dir() else shutil.copyfile)(source, target)
        leaks = paths_inside(tmp, forbidden)
        if leaks:
            raise UserError(
                f"model {config.name}: the published copy would name this machine's paths ({'; '.join(leaks[:3])})",
                "report this as a bug: a published repository must load anywhere",
            )
        files = write_manifest(tmp)
    total = sum(f["size"] for f in files.values())
    log.info("%s: portable model of %d files, %.1f MB", config.name, len(files), total / 1e6)
    return files


def publish_model_step(model_dir: str, output: str, project_dir: str, work: str, execution_env: str = "") -> dict[str, Any]:
    """Rule publish_model: `output` is the local copy Snakemake's storage plugin uploads after the job."""
    return portable_model(model_dir, output, machine_paths(project_dir, work), execution_env)


def package_versions() -> dict[str, str]:
    versions = {}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def publish_step(models: dict[str, str], validation_json: str, validation_md: str, output: str, output_md: str, url: str) -> dict:
    """Rule publish: manifest.json (versions, models, file hashes, the validation result) and the validation
    report next to the published repository."""
    if not url:
        raise UserError(
            "publish.url is not set: there is nowhere to publish to",
            "add `publish: {url: s3://BUCKET/PREFIX}` to config.yaml (and publish.endpoint_url for an S3-compatible server), "
            "with the credentials in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
        )
    report = json.loads(Path(validation_json).read_text())
    published = {}
    for name, directory in models.items():
        files = json.loads((Path(directory) / MANIFEST).read_text())["files"]
        config = read_model_config(Path(directory) / "config.pbtxt")
        checks = report["models"].get(name, {}).get("checks", [])
        published[name] = {
            "path": f"{REPOSITORY_PREFIX}/{name}",
            "backend": model_parameters(config).backend,
            "task": model_parameters(config).task,
            "files": {path: {"size": item["size"], "sha256": item["sha256"]} for path, item in files.items()},
            "validation": {"ok": all(c["ok"] for c in checks), "checks": len(checks)},
            "gpus": list(config_gpus(config)),
        }
    manifest = {
        "format": 1,
        "url": url,
        "published_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "triton": report["server"].get("version"),
        "packages": package_versions(),
        "validation": {"ok": report["ok"], "finished_at": report.get("finished_at")},
        "models": published,
        # the GPUs a replica needs: its instance groups and vllm engines name GPUs 0..gpus-1 (the pod numbers its own)
        "gpus": 1 + max((gpu for entry in published.values() for gpu in entry["gpus"]), default=-1),
    }
    atomic_write_json(output, manifest)
    shutil.copyfile(validation_md, output_md)
    log.info("manifest of %d models for %s", len(published), url)
    return manifest


# ---------------------------------------------------------------- replicas


def split_url(url: str) -> tuple[str, str]:
    """s3://bucket/prefix -> (bucket, prefix)."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise UserError(f"published repository {url!r} is not an s3://bucket/prefix URL", "give the publish.url `make publish` used")
    return parsed.netloc, parsed.path.strip("/")


def s3_client(endpoint_url: str = "", region: str = "us-east-1") -> Any:
    """boto3's S3 client; credentials from the standard AWS environment (never the command line)."""
    import boto3

    return boto3.client("s3", endpoint_url=endpoint_url or None, region_name=region)


def fetch_published(url: str, destination: str, endpoint_url: str = "", region: str = "us-east-1") -> dict[str, Any]:
    """Download the published repository below `url` into `destination` (replacing what an earlier fetch left) and
    verify every model's files against their manifest; returns manifest.json."""
    bucket, prefix = split_url(url)
    client = s3_client(endpoint_url, region)
    keys = [
        item["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/")
        for item in page.get("Contents", [])
    ]
    if f"{prefix}/{PUBLISHED_MANIFEST}" not in keys:
        raise UserError(
            f"no published repository at {url} ({PUBLISHED_MANIFEST} is missing)", "run `make publish` with this publish.url first"
        )
    with atomic_directory(destination) as tmp:
        for key in keys:
            relative = key[len(prefix) + 1 :]
            target = (tmp / relative).resolve()
            if relative.startswith("/") or ".." in Path(relative).parts or not target.is_relative_to(tmp.resolve()):
                raise UserError(f"published object {key!r} points outside the repository", f"remove it from {url}")
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, key, str(target))
        manifest = json.loads((tmp / PUBLISHED_MANIFEST).read_text())
        for name, entry in manifest["models"].items():
            found = problems(tmp / entry["path"])
            if found or not (tmp / entry["path"] / MANIFEST).is_file():
                raise UserError(
                    f"published model {name} at {url} does not match its manifest: {'; '.join(found[:3]) or 'no manifest'}",
                    "publish it again",
                )
    log.info("fetched %d objects of %s into %s (hashes verified)", len(keys), url, destination)
    return manifest


def serve_replica(url: str, work: str, server: Any, endpoint_url: str = "", region: str = "us-east-1") -> dict[str, Any]:
    """Fetch the published repository into `work`, start a tritonserver of its own there (`server`: a ServerSpec with
    this replica's host and ports) and validate it; returns the validation report."""
    from hf2triton.pipeline.validate import validate_server
    from hf2triton.triton.process import ensure_server
    from hf2triton.triton.settings import Settings

    local = Path(work) / "published"
    manifest = fetch_published(url, str(local), endpoint_url, region)
    if not manifest["validation"]["ok"]:
        raise UserError(f"{url} was published from a server whose validation failed", "fix the models and `make publish` again")
    settings = Settings(server, str(local / REPOSITORY_PREFIX), os.path.join(work, "state"), list(manifest["models"]))
    state = ensure_server(settings)
    results = Path(work) / "validation"
    return validate_server(settings, state, str(results / "report.json"), str(results / "report.md"))


HOST_PATTERN = re.compile(r"^[0-9A-Za-z.:\[\]-]{1,64}$")


def replica_main(args: Any) -> int:
    """`python -m hf2triton replica URL --work DIR ...`: serve (or --stop) one replica."""
    from hf2triton.config import path_problem
    from hf2triton.specs import ServerSpec
    from hf2triton.triton.process import stop_server
    from hf2triton.triton.settings import Settings

    if not HOST_PATTERN.match(args.host):
        raise UserError(f"--host {args.host!r} is not an address", "give an IP address or host name, e.g. 127.0.0.1")
    split_url(args.url)
    problem = path_problem(str(Path(args.work).resolve()))
    if problem:  # the server would not start there: refused before anything is downloaded
        raise UserError(f"--work {args.work} {problem}", "give a replica directory of letters, digits and _ . / - only")
    server = ServerSpec(host=args.host, http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port)
    work = str(Path(args.work).resolve())
    if args.stop:
        print(stop_server(Settings(server, os.path.join(work, "published", REPOSITORY_PREFIX), os.path.join(work, "state"), [])))
        return 0
    report = serve_replica(args.url, work, server, args.endpoint_url, args.region)
    print(f"hf2triton: replica of {args.url} serving {', '.join(report['models'])} at {report['server']['http']} (HTTP), "
          f"{report['server']['grpc']} (gRPC); validation PASS ({work}/validation/report.md)")  # fmt: skip
    return 0
