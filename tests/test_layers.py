"""The layer table of docs/architecture.md and "no import circles", checked on the source (issue 34, item 6).

Every import counts, lazy ones inside functions too (a lazy import hides a
circle or a layer break from tools, not from the design); imports under
``if TYPE_CHECKING:`` do not. Test modules (``test_*.py``) of suites/ are
clauses: they follow their folder's layer like the rest.
"""

from __future__ import annotations

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("reports", "backends", "native", "fixtures", "suites")

# The layer of each top-level package and what it may import, as docs/architecture.md's table says
# (its "imports" column); ALLOWED_EXTRA names the single imports the table allows across a layer:
# (importing layer or module, imported module).
LAYER = {"reports": "reports", "backends": "backends", "native": "backends", "fixtures": "harness",
         "suites": "contract"}
MAY_IMPORT = {
    "reports": {"reports"},
    "backends": {"backends"},
    "harness": {"harness", "backends"},
    "contract": {"contract", "harness", "backends", "reports"},
}
ALLOWED_EXTRA = {
    ("harness", "reports.collector"),  # report_dir: where a launched run's rank logs and journal go
    ("reports.contracts", "backends.spec"),  # CONTRACTS.md names the parameters that state a requirement
}


def modules() -> dict[str, str]:
    found = {}
    for package in PACKAGES:
        for dirpath, dirs, files in os.walk(os.path.join(ROOT, package)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "build")]
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    found[module.removesuffix(".__init__")] = path
    return found


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", "")
            if name == "TYPE_CHECKING":
                skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skipped


def imports(module: str, path: str, known: set[str]) -> set[str]:
    """The project modules ``module`` imports (the longest known prefix of each name), lazy ones included."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    skipped = _type_checking_nodes(tree)
    is_package = path.endswith("__init__.py")
    targets: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):
                targets.add(name)
    return targets


def graph() -> dict[str, set[str]]:
    found = modules()
    return {module: imports(module, path, set(found)) for module, path in found.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer_breaks(edges: dict[str, set[str]]) -> list[str]:
    breaks = []
    for module, targets in sorted(edges.items()):
        layer = LAYER[module.split(".")[0]]
        for target in sorted(targets):
            target_layer = LAYER[target.split(".")[0]]
            allowed = target_layer in MAY_IMPORT[layer] or any(
                importer in (layer, module) and (target == extra or target.startswith(extra + "."))
                for importer, extra in ALLOWED_EXTRA)
            if not allowed:
                breaks.append(f"{module} ({layer}) imports {target} ({target_layer})")
    return breaks


def test_no_import_circle_among_the_projects_modules():
    """No module imports one that imports it back, directly or through others, lazy imports counted."""
    assert circles(graph()) == []


def test_every_import_follows_the_layer_table():
    """reports imports nothing of the project; backends only itself; the harness backends (and report_dir);
    the contract the layers above it."""
    assert layer_breaks(graph()) == []


def test_the_checks_fail_on_a_circle_and_on_a_layer_break():
    edges = {"reports.a": {"backends.spec"}, "backends.spec": {"backends.b"}, "backends.b": {"backends.spec"},
             "suites.x": {"fixtures.y"}, "fixtures.y": {"reports.collector"}}
    assert circles(edges) == [["backends.b", "backends.spec"]]
    assert layer_breaks(edges) == ["reports.a (reports) imports backends.spec (backends)"]


def test_the_table_in_the_docs_names_these_layers():
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        text = f.read()
    rows = re.findall(r"^\| (\w+) \| (`[^|]+`) \|", text, re.MULTILINE)
    documented = {layer: set(re.findall(r"`(\w+)/`", folders)) for layer, folders in rows}
    expected: dict[str, set[str]] = {}
    for package, layer in LAYER.items():
        expected.setdefault(layer, set()).add(package)
    assert documented == expected, "docs/architecture.md's layer table and tests/test_layers.py disagree"


@pytest.mark.parametrize("source, expected", [
    ("import reports.views\n", {"reports.views"}),
    ("def f():\n    from backends import spec\n", {"backends", "backends.spec"}),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import fixtures.world\n", set()),
])
def test_lazy_imports_count_and_type_checking_ones_do_not(tmp_path, source, expected):
    path = tmp_path / "m.py"
    path.write_text(source)
    known = {"reports", "reports.views", "backends", "backends.spec", "fixtures", "fixtures.world"}
    assert imports("suites.m", str(path), known) == expected
