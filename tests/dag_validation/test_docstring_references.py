"""Every module, dotted name or file of ours that a docstring in ``include/`` names exists.

A docstring that points a reader to ``generation.pool`` after the pool moved to the engine
sends them nowhere; names rot as modules move. A reference counts as ours when it starts with
``include`` (or another folder of the repository) or with one of ``include``'s packages or top
modules (``engine.dispatch``, ``layout.shard_key``, ``engine.py``); anything else (SGLang's
``scheduler.py``, a task id ``shard.generate``, ``report.json``) is prose about other things.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "include"
FOLDERS = ("include", "dags", "plugins", "tests", "scripts", "sglang_standin", "deploy", "docs")
#: include's packages and top modules: a reference starting with one of these is ours.
OURS = frozenset(p.stem if p.is_file() else p.name for p in INCLUDE.iterdir()
                 if (p.is_dir() and (p / "__init__.py").exists())
                 or (p.suffix == ".py" and p.stem != "__init__"))
#: Data files named in prose (``report.json``, ``conversations.jsonl``): not modules.
DATA_SUFFIXES = (".json", ".jsonl", ".md", ".html", ".parquet", ".png", ".txt", ".yaml")
REFERENCE = re.compile(r"``?([A-Za-z_][\w./]*[\w])``?")


def docstrings(root: Path = INCLUDE) -> Iterator[tuple[str, int, str]]:
    """Yield (file, line, docstring) for every module, class and function docstring."""
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                text = ast.get_docstring(node, clean=False)
                if text:
                    yield (str(path.relative_to(root.parent)), getattr(node, "lineno", 1),
                           text)


def is_ours(name: str) -> bool:
    if name.endswith(DATA_SUFFIXES):
        return False
    first = re.split(r"[./]", name, maxsplit=1)[0]
    return (first in FOLDERS or first in OURS) and ("." in name or "/" in name)


def resolves(name: str) -> bool:
    """Return whether a reference of ours names a file, a module or a module's attribute."""
    if "/" in name or name.endswith(".py"):
        path = name if name.startswith(FOLDERS) else f"include/{name}"
        return (ROOT / path).exists()
    parts = name.split(".")
    if parts[0] != "include":
        parts = ["include", *parts]
    for cut in range(len(parts), 1, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def stale_references(root: Path = INCLUDE) -> list[str]:
    return [f"{path}:{line} names `{name}`"
            for path, line, text in docstrings(root)
            for name in REFERENCE.findall(text) if is_ours(name) and not resolves(name)]


def test_every_reference_a_docstring_makes_resolves() -> None:
    stale = stale_references()
    assert not stale, "docstrings naming what no longer exists (fix the name): " + "; ".join(
        stale)


@pytest.mark.parametrize("planted", ["``generation.pool``", "``engine.py``",
                                     "``include.layout.no_such_key``", "`durability.gone`"])
def test_a_planted_stale_name_is_found(tmp_path: Path, planted: str) -> None:
    package = tmp_path / "include"
    package.mkdir()
    (package / "m.py").write_text(f'"""See {planted} and ``layout.shard_key``."""\n')
    assert [s.split(" names ")[1] for s in stale_references(package)] == [
        "`" + planted.strip("`") + "`"]


def test_what_is_not_ours_is_left_alone() -> None:
    for name in ("scheduler.py", "shard.generate", "report.json", "json.dumps",
                 "conversations.jsonl", "str.splitlines"):
        assert not is_ours(name), name
    for name in ("engine.dispatch", "include/layout.py", "layout.shard_key", "engine.py"):
        assert is_ours(name), name
