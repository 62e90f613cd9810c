"""The configuration reference of the docs, generated from schemas/config.schema.yaml (the one source of every key,
type, default, bound and description): one table row per field, `models[].onnx.quantize` style paths.

Also the mkdocs hook that puts it into docs/configuration.md where the page says `<!-- config-reference -->`
(mkdocs.yml `hooks:`), and `python -m hf2triton.docs_reference` prints it."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import yaml

SCHEMA = Path(__file__).resolve().parents[1] / "schemas" / "config.schema.yaml"
MARKER = "<!-- config-reference -->"


def _resolve(node: dict, defs: dict) -> dict:
    """A field with `$ref` into `$defs`: the definition, with the field's own keys (default, description) on top."""
    if "$ref" not in node:
        return node
    name = node["$ref"].rsplit("/", 1)[-1]
    return {**_resolve(defs[name], defs), **{k: v for k, v in node.items() if k != "$ref"}}


MARKDOWN_SPECIAL = "|[]()*_`\\{}<>#!~"  # a `|` would end the table cell; the others could start links, emphasis, escapes


def _code(value: str) -> str:
    """Inline code that survives a Markdown table cell: Markdown's special characters as character references."""
    return "<code>" + "".join(f"&#{ord(c)};" if c in MARKDOWN_SPECIAL or c == "&" else c for c in value) + "</code>"


def _text(value: str) -> str:
    return html.escape(" ".join(str(value).split()), quote=False).replace("|", "&#124;")


def _type(node: dict, defs: dict) -> str:
    if "enum" in node and "type" not in node:
        kinds = sorted({"null" if v is None else type(v).__name__.replace("str", "string").replace("int", "integer") for v in node["enum"]})
        return " or ".join(kinds)
    kind = node.get("type", "any")
    kinds = kind if isinstance(kind, list) else [kind]
    if "array" in kinds and "items" in node:
        return "array of " + _type(_resolve(node["items"], defs), defs)
    return " or ".join(kinds)


def _bounds(node: dict, defs: dict) -> str:
    parts = []
    if "enum" in node:
        parts.append(", ".join(_code("null" if v is None else str(v)) for v in node["enum"]))
    if "minimum" in node or "maximum" in node:
        parts.append(f"{node.get('minimum', '…')}–{node.get('maximum', '…')}")
    if "minLength" in node or "maxLength" in node:
        parts.append(f"{node.get('minLength', 0)}–{node.get('maxLength', '…')} characters")
    if "pattern" in node:
        parts.append(_code(node["pattern"]))
    if "minItems" in node or "maxItems" in node:
        parts.append(f"{node.get('minItems', 0)}–{node.get('maxItems', '…')} items")
    if node.get("uniqueItems"):
        parts.append("unique")
    if "items" in node:
        inner = _bounds(_resolve(node["items"], defs), defs)
        if inner and _resolve(node["items"], defs).get("type") != "object":
            parts.append(f"each: {inner}")
    return "; ".join(parts)


def _default(node: dict, required: bool) -> str:
    if "default" in node:
        return _code(json.dumps(node["default"], ensure_ascii=False))
    return "**required**" if required else "—"


def rows(schema: dict | None = None) -> list[tuple[str, str, str, str, str]]:
    """(path, type, default, allowed values / range, description) for every field of the schema, depth first in the
    schema's own order; array items as `[]`, an object's free-form keys (overrides) as `.<name>`."""
    schema = schema if schema is not None else yaml.safe_load(SCHEMA.read_text())
    defs = schema.get("$defs", {})
    found: list[tuple[str, str, str, str, str]] = []

    def walk(node: dict, path: str, required: bool) -> None:
        node = _resolve(node, defs)
        if path:
            found.append((path, _type(node, defs), _default(node, required), _bounds(node, defs), _text(node.get("description", ""))))
        if node.get("type") == "array" and isinstance(node.get("items"), dict):
            items = _resolve(node["items"], defs)
            if items.get("type") == "object":
                walk_properties(items, f"{path}[]")
        elif "properties" in node:
            walk_properties(node, path)
        elif isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}.<name>", False)

    def walk_properties(node: dict, path: str) -> None:
        for name, child in node["properties"].items():
            walk(child, f"{path}.{name}" if path else name, name in node.get("required", []))

    walk(schema, "", True)
    return found


def table(schema: dict | None = None) -> str:
    lines = ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
    lines += [f"| `{path}` | {kind} | {default} | {bounds} | {text} |" for path, kind, default, bounds, text in rows(schema)]
    return "\n".join(lines) + "\n"


def on_page_markdown(markdown: str, page, **kwargs) -> str:  # mkdocs hook
    """docs/configuration.md's marker becomes the table (read from the schema at every build)."""
    if MARKER in markdown:
        return markdown.replace(MARKER, table())
    return markdown


def top_level_keys(schema: dict | None = None) -> list[str]:
    schema = schema if schema is not None else yaml.safe_load(SCHEMA.read_text())
    return list(schema["properties"])


def field_paths(markdown: str) -> set[str]:
    """The key paths a rendered table lists (for tests)."""
    return set(re.findall(r"^\| `([^`]+)` \|", markdown, re.M))


if __name__ == "__main__":
    print(table(), end="")
