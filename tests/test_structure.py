"""The package's shape, checked without importing it (ast only, no server: about a second).

Imports: every module under hf2triton/ (found by glob, so a new module is covered without touching this file)
is parsed and its imports of other hf2triton modules become edges of a graph, which must have no cycle.

What counts as an import of module M:
  - `import hf2triton.a.b`, `from hf2triton.a import b` (b a submodule: hf2triton.a.b; else hf2triton.a), relative
    forms (`from . import b`, `from ..a import c`) resolved against the importing module's package;
  - importing a submodule runs its packages' __init__.py first, so hf2triton.a.b also depends on hf2triton.a (not
    counted for the importer's own packages: they are being imported already);
  - `importlib.import_module("hf2triton.a")` with a literal name, and serving/model.py's `_load_sibling("x")`
    (a sibling loaded by file when Triton runs the rendered copy, as hf2triton.serving.x otherwise);
  - imports inside a function body and under `if TYPE_CHECKING:` are lazy (not run when the module is imported).

Two graphs are checked, and both must be acyclic:
  - module level (everything run on import: outside function bodies and TYPE_CHECKING blocks, including
    try/except and class bodies). This is the order Python runs modules in; a cycle here is an ImportError
    (or a half-initialised module) waiting for a reordering.
  - every import, lazy ones included. A function-level or TYPE_CHECKING import that only dodges a circle hides the
    cycle instead of removing it, so it counts the same. A lazy import of an hf2triton module is fine for what lazy
    imports are for (not loading a heavy or optional dependency until it is used, a short CLI start), as long as
    the dependency does not point back.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hf2triton"

MAX_LINES = 600
# being split in issue 41 (split-serving and split-gateway branches): emptied when they merge
OVER_LINE_LIMIT_FOR_NOW: frozenset[str] = frozenset()  # emptied when issue 41 merged


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the package (a package's name is its __init__.py's)."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module, module: str, is_package: bool, modules: dict[str, Path]) -> list[tuple[str, bool]]:
    """(imported hf2triton module, whether it is imported lazily: inside a function or under TYPE_CHECKING)."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def target(name: str) -> str | None:
        """The longest hf2triton module a dotted name starts with."""
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            candidate = ".".join(parts[:end])
            if candidate in modules:
                return candidate
        return None

    def add(name: str, lazy: bool) -> None:
        hit = target(name)
        if hit:
            found.append((hit, lazy))

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            visit(node.test, lazy)
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, lazy)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            lazy = True
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, lazy)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:
                add(f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in modules else prefix, lazy)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name == "import_module":
                add(node.args[0].value, lazy)
            elif name == "_load_sibling":
                add(f"{package}.{node.args[0].value}", lazy)
        for child in ast.iter_child_nodes(node):
            visit(child, lazy)

    visit(tree, False)
    return found


@functools.cache
def _imports_by_module(package: Path) -> dict[str, list[tuple[str, bool]]]:
    """Every module's imports (parsed once per package: the tests share them)."""
    modules = module_files(package)
    return {
        name: _imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), name, path.name == "__init__.py", modules)
        for name, path in modules.items()
    }


def import_graph(include_lazy: bool, package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (and their packages), module-level only or with lazy imports."""
    imports = _imports_by_module(package)
    graph: dict[str, set[str]] = {name: set() for name in imports}
    for name, found in imports.items():
        for imported, lazy in found:
            if lazy and not include_lazy:
                continue
            parts = imported.split(".")
            for end in range(1, len(parts) + 1):  # hf2triton.a.b runs hf2triton/__init__ and hf2triton/a/__init__ first
                dependency = ".".join(parts[:end])
                if dependency != name and dependency in imports and not name.startswith(dependency + "."):
                    graph[name].add(dependency)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a -> ... -> a) through each strongly connected component that has one (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [_cycle_in(graph, set(component)) for component in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start = min(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if nxt not in previous:
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle in component {sorted(component)}")


def _describe(cycles: list[list[str]]) -> str:
    return "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_module_level_imports_are_acyclic():
    cycles = find_cycles(import_graph(include_lazy=False))
    assert not cycles, f"import cycles at module level:\n{_describe(cycles)}"


def test_imports_are_acyclic_counting_the_ones_inside_functions():
    cycles = find_cycles(import_graph(include_lazy=True))
    assert not cycles, f"import cycles (counting imports inside functions):\n{_describe(cycles)}"


def test_graph_sees_every_kind_of_import(tmp_path):
    """The walker itself, on a package made for it."""
    files = {
        "__init__.py": "",
        "base.py": "import os\n",
        "a/__init__.py": "",
        "a/rel.py": "from . import sib\nfrom .. import base\nfrom ..b.deep import thing\n",
        "a/sib.py": "from pkg.a import rel as _unused\n",  # a submodule named in `from x import y`
        "b/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import typed\nelse:\n    import pkg.base\n",
        "b/deep.py": "import importlib\nmod = importlib.import_module('pkg.base')\ndef f():\n    import pkg.lazy\n",
        "serving.py": "def _load_sibling(name): ...\ninterface = _load_sibling('base')\n",
        "typed.py": "",
        "lazy.py": "",
    }
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    eager = import_graph(include_lazy=False, package=tmp_path / "pkg")
    assert eager["pkg.a.rel"] == {"pkg.a.sib", "pkg.base", "pkg.b", "pkg.b.deep"}  # pkg.b: its __init__ runs first
    assert eager["pkg.a.sib"] == {"pkg.a.rel"}
    assert eager["pkg.b"] == {"pkg.base"}  # the TYPE_CHECKING branch is lazy, its else branch is not
    assert eager["pkg.b.deep"] == {"pkg.base"}
    assert eager["pkg.serving"] == {"pkg.base"}
    everything = import_graph(include_lazy=True, package=tmp_path / "pkg")
    assert everything["pkg.b"] == {"pkg.base", "pkg.typed"}
    assert everything["pkg.b.deep"] == {"pkg.base", "pkg.lazy"}
    assert find_cycles(eager) == [["pkg.a.rel", "pkg.a.sib", "pkg.a.rel"]]


def test_graph_sees_the_siblings_model_py_loads():
    """serving/model.py runs in Triton as a file with copies of its siblings next to it (relative imports)."""
    graph = import_graph(include_lazy=False)
    assert {"hf2triton.serving.interface", "hf2triton.serving.inputs", "hf2triton.serving.tasks"} <= graph["hf2triton.serving.model"]


def test_cycle_detection_reports_the_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_modules_are_at_most_600_lines():
    lengths = {str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines()) for path in module_files().values()}
    too_long = {path: n for path, n in sorted(lengths.items()) if n > MAX_LINES and path not in OVER_LINE_LIMIT_FOR_NOW}
    assert not too_long, f"modules over {MAX_LINES} lines (split them by concern): {too_long}"
    stale = sorted(path for path in OVER_LINE_LIMIT_FOR_NOW if lengths.get(path, 0) <= MAX_LINES)
    assert not stale, f"remove from OVER_LINE_LIMIT_FOR_NOW (gone or within the limit now): {stale}"
