"""The shard stage reaches durability through its one door (``include.durability.door``) and
nothing else of it: the lease, claims, fencing, journal and settings record stay behind it.

Imports are read from the source (``ast``), lazy ones inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOOR = "include.durability.door"
DOOR_NAMES = {"ShardDurability"}


def durability_imports(path: Path) -> list[str]:
    """Return what ``path`` imports of ``include.durability``, as dotted names."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("include.durability")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "include.durability"):
            found += [f"{node.module}.{a.name}" for a in node.names]
    return found


def outside_the_door(imports: list[str]) -> list[str]:
    return [name for name in imports
            if name.rpartition(".")[0] != DOOR or name.rpartition(".")[2] not in DOOR_NAMES]


def test_the_shard_stage_imports_nothing_of_durability_but_the_door() -> None:
    stage = sorted((ROOT / "include" / "generation").rglob("*.py"))
    assert stage
    found = {str(p.relative_to(ROOT)): durability_imports(p) for p in stage}
    assert found["include/generation/shard.py"] == [f"{DOOR}.ShardDurability"]
    wrong = {path: outside_the_door(names) for path, names in found.items()
             if outside_the_door(names)}
    assert not wrong, f"the shard stage reaches past durability's door: {wrong}"


def test_the_check_sees_a_planted_import(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("from include.durability.door import ShardDurability\n"
                       "def f():\n    from include.durability.lease import check_token\n"
                       "import include.durability.claims\n")
    assert sorted(outside_the_door(durability_imports(planted))) == [
        "include.durability.claims", "include.durability.lease.check_token"]
