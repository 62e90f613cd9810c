"""The documentation: the configuration reference generated from the schema (every field, with its default and
bounds), the site's pages all in mkdocs.yml's nav, the README short and its links alive, every benchmark script
indexed."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from hf2triton import docs_reference
from tests.helpers import ROOT

SCHEMA = yaml.safe_load((ROOT / "schemas" / "config.schema.yaml").read_text())


def resolve(node: dict) -> dict:
    if "$ref" in node:
        return {**SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def schema_paths(node: dict, path: str = "") -> set[str]:
    """Every field path of the schema, walked independently of the generator."""
    node = resolve(node)
    found = {path} if path else set()
    items = resolve(node["items"]) if node.get("type") == "array" and isinstance(node.get("items"), dict) else {}
    for name, child in items.get("properties", {}).items():
        found |= schema_paths(child, f"{path}[].{name}")
    for name, child in node.get("properties", {}).items():
        found |= schema_paths(child, f"{path}.{name}" if path else name)
    if isinstance(node.get("additionalProperties"), dict):
        found |= schema_paths(node["additionalProperties"], f"{path}.<name>")
    return found


def test_config_reference_renders_every_field_of_the_schema():
    table = docs_reference.table()
    listed = docs_reference.field_paths(table)
    assert set(SCHEMA["properties"]) <= listed, "every top-level key has a row"
    assert schema_paths(SCHEMA) == listed
    assert len(listed) == len(table.splitlines()) - 2, "one row per field, no duplicates"
    rows = {path: (kind, default, bounds, text) for path, kind, default, bounds, text in docs_reference.rows()}
    assert rows["models[].max_batch_size"][:3] == ("integer", "<code>8</code>", "0–1024")
    assert rows["models[].source"][1] == "**required**"
    assert rows["models[].task"][1] == "—" and "text-generation" in rows["models[].task"][2] and "inferred" in rows["models[].task"][3]
    assert rows["server.http_port"][1:3] == ("<code>8000</code>", "1–65535"), "$ref fields carry their own default"
    assert rows["bench.protocols"][0] == "array of string"
    assert all(text for path, (_, _, _, text) in rows.items() if path != "overrides.<name>"), "every field is described"


def test_config_reference_cells_cannot_break_the_table():
    """A `|` in a pattern or description would end its cell; `[...](...)` in a pattern would become a link."""
    for line in docs_reference.table().splitlines()[2:]:
        assert line.count("|") == 6, line
    assert "](" not in docs_reference.table()


def test_the_hook_puts_the_table_where_the_page_asks():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page.count(docs_reference.MARKER) == 1
    rendered = docs_reference.on_page_markdown(page, page=None)
    assert docs_reference.MARKER not in rendered and "| `models[].onnx.quantize` |" in rendered
    assert docs_reference.on_page_markdown("# other page\n", page=None) == "# other page\n"


def test_every_docs_page_is_in_the_nav_and_the_hook_exists():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(nav) -> set[str]:
        found = set()
        for entry in nav:
            for value in entry.values() if isinstance(entry, dict) else [entry]:
                found |= pages(value) if isinstance(value, list) else {value}
        return found

    assert pages(config["nav"]) == {p.name for p in (ROOT / "docs").glob("*.md")}
    assert all((ROOT / hook).is_file() for hook in config["hooks"])
    assert config["theme"]["font"] is False, "no Google Fonts"
    assert set(config.get("plugins", [])) <= {"search"}, "no plugin that downloads at build time (social, privacy)"


def test_readme_is_short_and_its_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for document in ("README.md", "benchmarks/README.md", "benchmarks/probes/README.md"):
        text = (ROOT / document).read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not target.startswith(("http://", "https://")):
                assert ((ROOT / document).parent / target).exists(), f"{document}: {target}"


def test_every_benchmark_script_is_indexed():
    index = (ROOT / "benchmarks" / "README.md").read_text() + (ROOT / "benchmarks" / "probes" / "README.md").read_text()
    scripts = [p for p in (ROOT / "benchmarks").rglob("*") if p.suffix in (".py", ".sh") and ".work" not in p.parts]
    missing = [str(p.relative_to(ROOT)) for p in scripts if p.name not in index]
    assert missing == []
    top = [p.name for p in (ROOT / "benchmarks").iterdir() if p.is_file()]
    assert len(top) <= 12, top


def test_the_site_builds_strictly(tmp_path):
    """What `make docs` runs (a broken link or anchor fails it); skipped where the docs tools are not installed."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    html = (tmp_path / "site" / "configuration.html").read_text()
    assert "models[].onnx.quantize" in html and docs_reference.MARKER not in html
    assert (tmp_path / "site" / "playground" / "real-chat.png").is_file()
