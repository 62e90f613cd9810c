"""Validation's remembered in-process answers: computed once per model files, arguments and code, taken again only
when all of them are the same, and never for a model whose files changed since its build or for a GPU answer."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from hf2triton import integrity
from hf2triton.pipeline import references
from hf2triton.serving.interface import ModelParameters


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(references.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / references.FOLDER


def built(tmp_path, name="pretrained", weights=b"w" * 100):
    root = tmp_path / name
    root.mkdir()
    (root / "model.safetensors").write_bytes(weights)
    integrity.write_manifest(root)
    return str(root)


class Counting:
    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return {"embedding": np.full((2, 3), float(self.calls))}


def test_the_same_reference_is_computed_once_and_answered_equal(tmp_path, cache):
    model, compute = built(tmp_path), Counting()
    first = references.remembered("outputs", model, "cpu", {"texts": ["a", "b"]}, compute)
    hits = len(references.REMEMBERED)
    again = references.remembered("outputs", model, "cpu", {"texts": ["a", "b"]}, compute)
    assert compute.calls == 1 and np.array_equal(first["embedding"], again["embedding"])
    assert references.REMEMBERED[hits:] == ["outputs"] and len(list(cache.iterdir())) == 1


def test_the_same_files_in_another_folder_share_it_other_files_or_arguments_do_not(tmp_path, cache):
    compute = Counting()
    references.remembered("outputs", built(tmp_path, "a"), "cpu", {"texts": ["a"]}, compute)
    references.remembered("outputs", built(tmp_path, "b"), "cpu", {"texts": ["a"]}, compute)  # a rebuild elsewhere
    assert compute.calls == 1
    references.remembered("outputs", built(tmp_path, "c", b"x" * 100), "cpu", {"texts": ["a"]}, compute)  # other weights
    references.remembered("outputs", built(tmp_path, "d"), "cpu", {"texts": ["b"]}, compute)  # other probes
    references.remembered("entities", built(tmp_path, "e"), "cpu", {"texts": ["a"]}, compute)  # another reference
    references.remembered("outputs", built(tmp_path, "f"), "cpu", {"texts": [b"\x89PNG"]}, compute)  # an image, by digest
    assert compute.calls == 5


def test_changed_files_no_manifest_a_gpu_or_off_always_compute(tmp_path, cache, monkeypatch):
    model, compute = built(tmp_path), Counting()
    references.remembered("outputs", model, "cpu", {}, compute)
    (tmp_path / "pretrained" / "model.safetensors").write_bytes(b"v" * 100)  # edited after its build
    references.remembered("outputs", model, "cpu", {}, compute)
    bare = tmp_path / "bare"
    bare.mkdir()
    for _ in range(2):
        references.remembered("outputs", str(bare), "cpu", {}, compute)
        references.remembered("outputs", built(tmp_path, f"gpu{compute.calls}"), "cuda:0", {}, compute)
    monkeypatch.setenv(references.CACHE_ENV, "off")
    references.remembered("outputs", built(tmp_path, "off"), "cpu", {}, compute)
    assert compute.calls == 1 + 1 + 4 + 1


def test_a_damaged_entry_is_computed_again_and_replaced(tmp_path, cache):
    model, compute = built(tmp_path), Counting()
    references.remembered("outputs", model, "cpu", {}, compute)
    (entry,) = cache.iterdir()
    entry.write_bytes(b"not a pickle")
    assert references.remembered("outputs", model, "cpu", {}, compute)["embedding"][0, 0] == 2.0
    assert references.remembered("outputs", model, "cpu", {}, compute)["embedding"][0, 0] == 2.0 and compute.calls == 2


def test_an_unwritable_cache_still_answers(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv(references.CACHE_ENV, str(blocked))  # its references folder cannot be made
    compute = Counting()
    assert references.remembered("outputs", built(tmp_path), "cpu", {}, compute)["embedding"][0, 0] == 1.0


def test_the_key_leaves_out_where_the_files_are():
    params = ModelParameters(task="feature-extraction", model_dir="/a/pretrained", onnx_dir="/a/onnx", dtype="float32")
    portable = references.portable(params)
    assert "model_dir" not in portable and "onnx_dir" not in portable and portable["dtype"] == "float32"


def test_a_remembered_call_is_keyed_by_its_function_and_arguments_and_finds_the_files(tmp_path, cache):
    """remembered_call: the kind is the function's name; the arguments are the key by name (a ModelParameters without
    its paths); the model's files come from `model_dir`, or from `params.model_dir`."""
    calls: list[tuple] = []

    def answer(model_dir: str, texts: list[str], device: str, dtype: str = "auto") -> dict[str, list[str]]:
        calls.append((model_dir, tuple(texts), device, dtype))
        return {"texts": texts}

    def from_parameters(params: ModelParameters, device: str) -> str:
        calls.append((params.model_dir, device))
        return params.task

    hits = len(references.REMEMBERED)
    for model in (built(tmp_path, "a"), built(tmp_path, "b")):  # the same files elsewhere: one computation
        assert references.remembered_call(answer, "cpu", model_dir=model, texts=["x"], dtype="float32") == {"texts": ["x"]}
    references.remembered_call(answer, "cpu", model_dir=built(tmp_path, "c"), texts=["x"], dtype="float16")  # another dtype
    assert [c[1:] for c in calls] == [(("x",), "cpu", "float32"), (("x",), "cpu", "float16")]
    assert references.REMEMBERED[hits:] == ["answer"]
    for where in ("d", "e"):
        params = ModelParameters(task="feature-extraction", model_dir=built(tmp_path, where), dtype="float32")
        assert references.remembered_call(from_parameters, "cpu", params=params) == "feature-extraction"
    assert len(calls) == 3 and references.REMEMBERED[hits:] == ["answer", "from_parameters"]


def test_torch_facts_without_a_gpu_do_not_import_torch():
    """Every serve's status and validation report torch's facts; without a GPU they are read from torch's version
    module, not from the imported package (seconds of CPU)."""
    code = "import sys; from hf2triton import host; f = host.torch_facts(); print(f['version'], 'torch' in sys.modules)"
    env = {**os.environ, "HF2TRITON_ASSUME_NO_GPU": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    import torch

    assert done.stdout.split() == [torch.__version__, "False"]


def test_entries_unused_for_a_month_are_pruned_when_another_is_written(tmp_path, cache):
    compute = Counting()
    references.remembered("outputs", built(tmp_path, "old"), "cpu", {"texts": ["old"]}, compute)
    references.remembered("outputs", built(tmp_path, "used"), "cpu", {"texts": ["used"]}, compute)
    month_ago = time.time() - (references.UNUSED_DAYS + 1) * 86400
    for entry in cache.iterdir():
        os.utime(entry, (month_ago, month_ago))
    references.remembered("outputs", built(tmp_path, "used-again"), "cpu", {"texts": ["used"]}, compute)  # a hit: kept
    references.remembered("outputs", built(tmp_path, "new"), "cpu", {"texts": ["new"]}, compute)  # written: prunes
    assert compute.calls == 3 and len(list(cache.iterdir())) == 2
    references.remembered("outputs", built(tmp_path, "old-again"), "cpu", {"texts": ["old"]}, compute)
    assert compute.calls == 4  # the unused one was deleted
