"""Every name a benchmark or script imports from the project exists (a refactor that moves a
function must move its benchmarks' imports too: they run outside the test tiers)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("include", "sglang_standin", "benchmarks", "scripts")
FILES = sorted([*ROOT.joinpath("benchmarks").glob("*.py"), *ROOT.joinpath("scripts").glob("*.py")])


def _imports(path: Path) -> list[tuple[str, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level \
                and node.module.split(".")[0] in OURS:
            out += [(node.module, alias.name) for alias in node.names]
    return out


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_each_imported_name_exists(path: Path) -> None:
    missing = []
    for module, name in _imports(path):
        mod = importlib.import_module(module)
        if not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{module}.{name}")
    assert not missing, f"{path.name} imports names that do not exist: {missing}"


def test_the_check_sees_the_benchmarks() -> None:
    assert len(FILES) > 10 and any(_imports(p) for p in FILES)
