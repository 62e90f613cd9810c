"""The static repository lint catches every load-time pitfall that can be seen before launch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf2triton.triton.lint import lint_model_dir, lint_repository
from hf2triton.triton.modelconfig import build_model_config, config_text

GOOD_MODEL_PY = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"


@pytest.fixture
def backends(tmp_path) -> Path:
    root = tmp_path / "backends"
    (root / "python").mkdir(parents=True)
    return root


def make_model(root: Path, name: str = "m", config: str | None = None, saved: Path | None = None) -> Path:
    model = root / "repo" / name
    (model / "1").mkdir(parents=True)
    params = {"task": "feature-extraction"}
    if saved is not None:
        params["model_dir"] = str(saved)
    (model / "config.pbtxt").write_text(
        config if config is not None else config_text(build_model_config(name, "feature-extraction", 4, 1, "KIND_CPU", 100, params, 8))
    )
    (model / "1" / "model.py").write_text(GOOD_MODEL_PY)
    return model


def fields(findings) -> list[str]:
    return [f.field for f in findings if f.severity == "error"]


def test_clean_model_has_no_findings(tmp_path, backends):
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "config.json").write_text(json.dumps({}))
    assert lint_model_dir(make_model(tmp_path, saved=saved), backends, gpu_available=False) == []


def test_misspelled_field_is_named_with_position(tmp_path, backends):
    model = make_model(tmp_path, config='name: "m"\nmax_batchsize: 4\nbackend: "python"\n')
    findings = lint_model_dir(model, backends, False)
    assert fields(findings) == ["max_batchsize"]
    assert "2:" in findings[0].message and "spelling" in findings[0].fix


def test_syntax_error_gives_line_and_column(tmp_path, backends):
    model = make_model(tmp_path, config='name: "m"\ninput {\n name: "x"\n data_type: TYPE_FP32\n dims: [ 1 ]\n\noutput { name: "y" }\n')
    findings = lint_model_dir(model, backends, False)
    assert fields(findings) == ["output"]
    assert "7:" in findings[0].message and "closing brace" in findings[0].fix
    unbalanced = make_model(tmp_path / "x", config='name: "m"\ninput {\n name: "x"\n')
    assert fields(lint_model_dir(unbalanced, backends, False)) == ["syntax"]


def test_name_differs_from_directory(tmp_path, backends):
    model = make_model(
        tmp_path, name="dir_name", config=config_text(build_model_config("other", "feature-extraction", 4, 1, "KIND_CPU", 0, {}, 8))
    )
    findings = lint_model_dir(model, backends, False)
    assert "name" in fields(findings)
    assert "unexpected directory name 'dir_name' for model 'other'" in findings[0].message


def test_notebook_debris_and_missing_versions(tmp_path, backends):
    model = make_model(tmp_path)
    (model / ".ipynb_checkpoints").mkdir()
    assert "version directory" in fields(lint_model_dir(model, backends, False))
    (model / "1" / "model.py").unlink()
    (model / "1").rmdir()
    errors = fields(lint_model_dir(model, backends, False))
    assert "versions" in errors


def test_missing_model_file(tmp_path, backends):
    model = make_model(tmp_path)
    (model / "1" / "model.py").unlink()
    findings = lint_model_dir(model, backends, False)
    assert fields(findings) == ["model file"]
    assert "never ready" in findings[0].message


def test_model_py_syntax_error(tmp_path, backends):
    model = make_model(tmp_path)
    (model / "1" / "model.py").write_text("def broken(:\n")
    assert fields(lint_model_dir(model, backends, False)) == ["line 1"]


def test_kind_gpu_without_gpu(tmp_path, backends):
    model = make_model(tmp_path, config=config_text(build_model_config("m", "feature-extraction", 4, 1, "KIND_GPU", 0, {}, 8)))
    assert fields(lint_model_dir(model, backends, gpu_available=False)) == ["instance_group.kind"]
    assert fields(lint_model_dir(model, backends, gpu_available=True)) == []


def test_backend_not_in_server(tmp_path, backends):
    model = make_model(
        tmp_path,
        config='name: "m"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        'input { name: "x" data_type: TYPE_FP32 dims: [1] }\noutput { name: "y" data_type: TYPE_FP32 dims: [1] }\n',
    )
    (model / "1" / "model.onnx").write_bytes(b"")
    findings = lint_model_dir(model, backends, False)
    assert "backend" in fields(findings)
    backend_finding = next(f for f in findings if f.field == "backend")
    assert "onnxruntime" in backend_finding.message and "python" in backend_finding.message


def test_input_without_data_type_and_dims(tmp_path, backends):
    model = make_model(
        tmp_path,
        config='name: "m"\nbackend: "python"\nmax_batch_size: 2\ninput { name: "text" }\n'
        'output { name: "y" data_type: TYPE_FP32 dims: [1] }\n',
    )
    errors = fields(lint_model_dir(model, backends, False))
    assert "input 'text'.data_type" in errors and "input 'text'.dims" in errors


def test_dynamic_batching_without_batch_size(tmp_path, backends):
    model = make_model(
        tmp_path,
        config='name: "m"\nbackend: "python"\nmax_batch_size: 0\ndynamic_batching {}\n'
        'input { name: "t" data_type: TYPE_STRING dims: [1] }\noutput { name: "y" data_type: TYPE_FP32 dims: [1] }\n',
    )
    assert fields(lint_model_dir(model, backends, False)) == ["dynamic_batching"]


def test_saved_model_missing(tmp_path, backends):
    model = make_model(tmp_path, saved=tmp_path / "gone")
    assert fields(lint_model_dir(model, backends, False)) == ["parameters.model_dir"]


def test_missing_config(tmp_path, backends):
    model = tmp_path / "repo" / "x"
    model.mkdir(parents=True)
    assert fields(lint_model_dir(model, backends, False)) == ["-"]


def test_repository_report(tmp_path, backends):
    make_model(tmp_path, name="a")
    bad = make_model(tmp_path, name="b")
    (bad / "1" / "model.py").unlink()
    report = lint_repository(tmp_path / "repo", backends, False)
    assert report["ok"] is False and report["models"]["a"]["ok"] and not report["models"]["b"]["ok"]


def test_onnx_model_explains_python_backend_path(tmp_path, backends):
    params = {"task": "feature-extraction", "backend": "onnx"}
    model = make_model(tmp_path, config=config_text(build_model_config("m", "feature-extraction", 4, 1, "KIND_CPU", 0, params, 8)))
    findings = lint_model_dir(model, backends, False)
    assert [f.severity for f in findings] == ["info"]
    assert "no native onnxruntime backend" in findings[0].message


def test_command_line_lint(tmp_path, backends):
    import subprocess
    import sys

    make_model(tmp_path, name="good")
    bad = make_model(tmp_path, name="bad")
    (bad / ".ipynb_checkpoints").mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "hf2triton", "lint", str(tmp_path / "repo")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 1
    assert "good: ok" in result.stdout and "bad: ERRORS" in result.stdout and ".ipynb_checkpoints" in result.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "hf2triton", "lint", str(tmp_path / "nope")], capture_output=True, text=True, check=False
    )
    assert missing.returncode == 1 and "hf2triton: error:" in missing.stderr and "Traceback" not in missing.stderr
