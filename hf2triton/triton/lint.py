"""Step `lint`: a static check of a model directory in a Triton repository, before the server sees it.

Catches every load-time pitfall that can be seen without starting Triton: config.pbtxt parsed with the
real `inference.ModelConfig` protobuf (so a misspelled field is named with its line), name != directory,
non-numeric version directories (notebook debris), missing model file, KIND_GPU without a GPU, a backend
the server does not have, tensors without data_type or dims, model.py syntax errors, a missing saved
model. Works on any hand-written repository too (`python -m hf2triton lint DIR`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from hf2triton import host
from hf2triton.triton.modelconfig import model_parameters, read_model_config
from hf2triton.triton.pitfalls import RENDER


@dataclass(frozen=True)
class Finding:
    severity: str  # "error" | "warning"
    file: str
    field: str
    message: str
    fix: str

    def line(self) -> str:
        return f"{self.severity}: {self.file}: {self.field}: {self.message} -- fix: {self.fix}"


def _parse_config(path: Path, findings: list[Finding]) -> mc.ModelConfig | None:
    try:
        return read_model_config(path)
    except UnicodeDecodeError:
        findings.append(Finding("error", str(path), "-", "not UTF-8 text", "save config.pbtxt as UTF-8"))
    except text_format.ParseError as err:
        message = str(err)
        unknown = re.search(r'has no field named "([^"]+)"', message)
        field = unknown.group(1) if unknown else "syntax"
        if unknown and "inference.ModelConfig" not in message:
            fix = f"'{field}' is not valid there: check its spelling, or a missing closing brace above the line given"
        elif unknown:
            fix = f"'{field}' is not a ModelConfig field; check its spelling"
        else:
            fix = "fix the text format at the line:column given"
        findings.append(Finding("error", str(path), field, message, fix))
    return None


def _check_tensors(config: mc.ModelConfig, path: str, findings: list[Finding]) -> None:
    for kind, tensors in (("input", config.input), ("output", config.output)):
        names = set()
        for tensor in tensors:
            where = f"{kind} '{tensor.name or '?'}'"
            if not tensor.name:
                findings.append(Finding("error", path, kind, f"an {kind} has no name", "give every tensor a name"))
            if tensor.name in names:
                findings.append(Finding("error", path, where, "duplicate tensor name", "use unique names"))
            names.add(tensor.name)
            if tensor.data_type == mc.TYPE_INVALID:
                findings.append(
                    Finding(
                        "error",
                        path,
                        f"{where}.data_type",
                        f"model {kind} '{tensor.name}' must specify 'data_type'",
                        "set data_type, e.g. TYPE_STRING",
                    )
                )
            if not tensor.dims and not tensor.HasField("reshape"):
                findings.append(Finding("error", path, f"{where}.dims", "no dims", "set dims (e.g. dims: [ 1 ])"))
            if any(d == 0 or d < -1 for d in tensor.dims):
                findings.append(Finding("error", path, f"{where}.dims", f"invalid dims {list(tensor.dims)}", "use positive sizes or -1"))


def lint_model_dir(model_dir: Path | str, backend_dir: Path | str | None, gpu_available: bool) -> list[Finding]:
    """All findings for one model directory of a repository."""
    model_dir = Path(model_dir)
    findings: list[Finding] = []
    config_path = model_dir / "config.pbtxt"
    if not config_path.is_file():
        return [Finding("error", str(config_path), "-", "config.pbtxt missing", f"render the repository (`{RENDER}`)")]
    config = _parse_config(config_path, findings)
    if config is None:
        return findings
    cfg = str(config_path)
    if config.name and config.name != model_dir.name:
        findings.append(
            Finding(
                "error",
                cfg,
                "name",
                f"unexpected directory name '{model_dir.name}' for model '{config.name}'",
                "make the directory name equal the model name",
            )
        )
    if config.max_batch_size < 0:
        findings.append(Finding("error", cfg, "max_batch_size", f"{config.max_batch_size} < 0", "use 0 (no batching) or a positive size"))
    if config.max_batch_size == 0 and config.HasField("dynamic_batching"):
        findings.append(
            Finding(
                "error", cfg, "dynamic_batching", "dynamic batching needs max_batch_size > 0", "set max_batch_size or drop dynamic_batching"
            )
        )
    _check_tensors(config, cfg, findings)
    for group in config.instance_group:
        if group.kind == mc.ModelInstanceGroup.KIND_GPU and not gpu_available:
            findings.append(
                Finding(
                    "error",
                    cfg,
                    "instance_group.kind",
                    "KIND_GPU but no GPUs are available on this host",
                    "use device: cpu or auto (KIND_CPU)",
                )
            )
    backend = config.backend or ("python" if config.platform == "" else "")
    if backend_dir is not None and backend:
        backend_path = Path(backend_dir) / backend
        if not backend_path.is_dir():
            available = sorted(p.name for p in Path(backend_dir).iterdir() if p.is_dir()) if Path(backend_dir).is_dir() else []
            findings.append(
                Finding(
                    "error",
                    cfg,
                    "backend",
                    f"unable to find backend library for backend '{backend}' in {backend_dir} "
                    f"(the server has: {', '.join(available) or 'none'})",
                    "use backend: python (the pip server ships only that), or a Triton install with this backend",
                )
            )
    versions = []
    for entry in sorted(model_dir.iterdir()):
        if entry.is_dir() and entry.name != "__pycache__":
            if entry.name.isdigit():
                versions.append(entry)
            else:
                findings.append(
                    Finding(
                        "error",
                        str(entry),
                        "version directory",
                        f"'{entry.name}' fails to convert to an integral version",
                        f"remove {entry}",
                    )
                )
    if not versions:
        findings.append(
            Finding("error", str(model_dir), "versions", "at least one version must be available (no numeric directory)", "create 1/")
        )
    filename = config.default_model_filename or ("model.py" if backend == "python" else "")
    for version in versions:
        model_file = version / filename if filename else None
        if model_file is not None and not model_file.is_file():
            findings.append(
                Finding(
                    "error",
                    str(model_file),
                    "model file",
                    "missing: the server would wait forever (never ready)",
                    f"render the repository again (`{RENDER}`)",
                )
            )
        elif model_file is not None and model_file.suffix == ".py":
            try:
                ast.parse(model_file.read_text(encoding="utf-8"), filename=str(model_file))
            except SyntaxError as err:
                findings.append(Finding("error", str(model_file), f"line {err.lineno}", f"Python syntax error: {err.msg}", "fix model.py"))
    params = model_parameters(config)
    if params.backend == "onnx" and backend_dir is not None:
        native = (Path(backend_dir) / "onnxruntime").is_dir()
        why = "this server also has a native onnxruntime backend" if native else "this tritonserver has no native onnxruntime backend"
        message = f"ONNX model served through the Python backend with ONNX Runtime; {why}"
        fix = "nothing to do: tokenisation stays server-side and inputs/outputs equal the torch variant's"
        findings.append(Finding("info", cfg, "parameters.backend", message, fix))
    if params.trt_engine:
        from hf2triton.pipeline.tensorrt import engine_staleness, tensorrt_version

        stale = engine_staleness(params.trt_engine, tensorrt_version(), host.gpu_name())
        if stale:
            findings.append(
                Finding("error", cfg, "parameters.trt_engine", f"the TensorRT engine cannot run here: {stale}", "rebuild it: make serve")
            )
    if params.model_dir:
        saved = Path(params.model_dir)
        if not (saved / "config.json").is_file():
            findings.append(Finding("error", cfg, "parameters.model_dir", f"{saved} holds no saved model", "rebuild it: make serve"))
    return findings


def lint_report(model_dir: Path | str, backend_dir: Path | str | None, gpu_available: bool) -> dict[str, Any]:
    findings = lint_model_dir(model_dir, backend_dir, gpu_available)
    return {
        "model_dir": str(model_dir),
        "ok": not any(f.severity == "error" for f in findings),
        "findings": [asdict(f) for f in findings],
    }


def lint_repository(repository: Path | str, backend_dir: Path | str | None, gpu_available: bool) -> dict[str, Any]:
    """Lint every model directory of a repository (for hand-written repositories)."""
    reports = {p.name: lint_report(p, backend_dir, gpu_available) for p in sorted(Path(repository).iterdir()) if p.is_dir()}
    return {"ok": all(r["ok"] for r in reports.values()), "models": reports}


def lint_step(model_dir: str, gpu_available: bool, output: str) -> dict[str, Any]:
    """Rule `lint`: lint one rendered model against the server that will load it; errors stop the run."""
    from hf2triton.errors import UserError
    from hf2triton.fsutil import atomic_write_json
    from hf2triton.triton.install import locate_tritonserver

    report = lint_report(model_dir, locate_tritonserver().backends, gpu_available)
    for finding in report["findings"]:
        print(Finding(**finding).line())
    if not report["ok"]:
        errors = [Finding(**f) for f in report["findings"] if f["severity"] == "error"]
        raise UserError(f"lint found {len(errors)} error(s) in {model_dir}: " + " | ".join(e.line() for e in errors))
    atomic_write_json(output, report)
    return report
