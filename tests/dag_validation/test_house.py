"""The shape of ``include/``: no import circle anywhere, no module too long to read in one go.

Imports are read from the source (``ast``), inside functions too: a lazy import that closes a
circle only hides it until the day someone moves it to the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "include"
#: The house rule is ~400 lines; this leaves room for a docstring that grew, not for a stage.
MAX_LINES = 450


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = INCLUDE) -> nx.DiGraph:
    """Return the graph of ``include`` modules, an edge for each import of one by another."""
    files = {_module_name(p): p for p in root.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for name, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # ``from include.pkg import mod`` imports the package, then its module.
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            for target in targets:
                if target in files and target != name:
                    graph.add_edge(name, target)
                # Importing ``a.b.c`` runs ``a/b/__init__.py`` first, unless the importer is
                # inside ``a.b`` itself (then that package is being imported already).
                package = target.rpartition(".")[0]
                while package in files and not name.startswith(package + "."):
                    graph.add_edge(name, package)
                    package = package.rpartition(".")[0]
    return graph


def test_the_graph_sees_imports_of_every_kind() -> None:
    graph = import_graph()
    assert len(graph) > 40
    # A lazy import inside a function, and a ``from package import module``.
    assert graph.has_edge("include.settings.checks", "include.servers.checks")
    assert any(target.startswith("include.storage") for target in graph["include.settings.checks"])


def test_no_import_circle_in_include() -> None:
    circles = [sorted(c) for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert not circles, (
        "import circles in include/ (each group imports itself through the others; move what "
        f"they share into a module of its own): {circles}")


def test_no_module_in_include_is_too_long_to_read_in_one_sitting() -> None:
    lengths = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
               for p in INCLUDE.rglob("*.py")}
    long = {path: n for path, n in lengths.items() if n > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by responsibility): {long}"
