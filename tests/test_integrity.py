"""Manifests of built artifacts: what changed since an artifact was built is found cheaply (size, then mtime
and only then a hash), and an artifact with nothing changed -- even touched -- counts as intact."""

from __future__ import annotations

import json
import os

from hf2triton import integrity


def built(tmp_path):
    root = tmp_path / "pretrained"
    (root / "sub").mkdir(parents=True)
    (root / "model.safetensors").write_bytes(b"w" * 1000)
    (root / "sub" / "config.json").write_text('{"a": 1}')
    integrity.write_manifest(root)
    return root


def test_an_intact_artifact_has_no_problems_even_when_touched(tmp_path):
    root = built(tmp_path)
    assert integrity.problems(root) == []
    os.utime(root / "model.safetensors", ns=(1, 1))  # same bytes, other mtime: hashed, found equal
    assert integrity.problems(root) == []


def test_same_size_edit_missing_and_added_files_are_named(tmp_path):
    root = built(tmp_path)
    (root / "model.safetensors").write_bytes(b"x" * 1000)  # same size, other content
    (root / "sub" / "config.json").unlink()
    (root / "notes.txt").write_text("added by hand")
    assert integrity.problems(root) == ["model.safetensors was modified", "sub/config.json is missing", "notes.txt was added"]
    assert integrity.damaged({"m:pretrained": str(root)}) == {str(root): integrity.problems(root)}


def test_an_unreadable_manifest_is_a_problem_and_no_manifest_is_none(tmp_path):
    root = built(tmp_path)
    (root / integrity.MANIFEST).write_text("{ not json")
    assert integrity.problems(root) == [f"{integrity.MANIFEST} is unreadable"]
    (root / integrity.MANIFEST).unlink()  # built before manifests existed: taken as it is
    assert integrity.problems(root) == []
    assert integrity.problems(tmp_path / "never-built") == []
    assert json.loads(json.dumps(integrity.describe(root)))  # plain data
