"""The pipeline pictures (README.md, the DAG's docstring, shown in the UI) draw the DAG's wiring.

A picture is a tree: each task hangs from the task it waits for, so its edges are the DAG's
edges less those a longer path already implies (the transitive reduction of the structure
test's ``DOWNSTREAM``; the XCom edges, such as the plan reaching the report, are implied).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.dag_validation.test_dag_structure import DAG_FILE, DOWNSTREAM

ROOT = Path(__file__).resolve().parents[2]
#: ``└─ name`` / ``├─ name`` (or a bare name on the first line), then anything.
_NODE = re.compile(r"^(?P<connector>\s*(?:[├└]─\s*)?)(?P<name>[a-z_]+)(?P<rest>.*)$")
#: The shard group's line: ``shard[...] (...): generate ─ upload ─ tokenize``.
_GROUP = re.compile(r"^\[[^\]]*\][^:]*:\s*(?P<chain>[a-z_]+(?:\s*─\s*[a-z_]+)*)\s*$")


def _code_block(text: str, after: str) -> str:
    start = text.index(after)
    return text[start:].split("```\n", 2)[1]


def readme_picture() -> str:
    return _code_block((ROOT / "README.md").read_text(), "## The pipeline")


def docstring_picture() -> str:
    return _code_block(ast.get_docstring(ast.parse(DAG_FILE.read_text())) or "", "```")


def drawn_edges(picture: str) -> tuple[set[str], set[tuple[str, str]]]:
    """Return the task ids a tree picture names and its edges (upstream, downstream)."""
    tasks: set[str] = set()
    edges: set[tuple[str, str]] = set()
    drawn: list[tuple[int, str]] = []  # (column of the name, the task children hang from)
    for line in picture.splitlines():
        if not line.strip() or line.strip() == "│":
            continue
        match = _NODE.match(line)
        assert match, f"not a task line of the picture: {line!r}"
        column = len(match["connector"])
        chain = [match["name"]]
        group = _GROUP.match(match["rest"])
        if group:
            chain = [f"{match['name']}.{step.strip()}"
                     for step in group["chain"].split("─")]
        parents = [task for col, task in drawn if col <= column - 3] if drawn else []
        if drawn:
            assert parents, f"{line!r} hangs from no task"
            edges.add((parents[-1], chain[0]))
        edges.update(zip(chain, chain[1:], strict=False))
        tasks.update(chain)
        drawn.append((column, chain[-1]))
    return tasks, edges


def transitive_reduction(downstream: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Return the edges no longer path implies."""
    def reachable(start: str) -> set[str]:
        seen, todo = set(), list(downstream[start])
        while todo:
            task = todo.pop()
            if task not in seen:
                seen.add(task)
                todo.extend(downstream[task])
        return seen

    return {(up, down) for up, downs in downstream.items() for down in downs
            if not any(down in reachable(other) for other in downs - {down})}


@pytest.mark.parametrize("picture", [readme_picture, docstring_picture],
                         ids=["README.md", "DAG docstring"])
def test_the_picture_draws_every_task_and_exactly_the_dag_s_wiring(picture) -> None:
    tasks, edges = drawn_edges(picture())
    assert tasks == set(DOWNSTREAM)
    assert edges == transitive_reduction(DOWNSTREAM)


def test_the_readme_task_table_names_every_task() -> None:
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| task | does | code |"):].split("\n\n", 1)[0]
    named = {name for row in table.splitlines()[2:]
             for name in re.findall(r"`([a-z_.]+)`", row.split("|")[1])}
    assert named == set(DOWNSTREAM)


def test_a_picture_with_preflight_s_arrow_on_tokenize_is_refused() -> None:
    # The README's old mistake, drawn as a tree: preflight feeding tokenize, not generate.
    wrong = ("check_settings\n└─ prepare_prompts\n   └─ launch_servers\n      └─ health_targets\n"
             "         └─ wait_for_server\n            └─ shard[x] (m): generate ─ upload\n"
             "               └─ preflight\n                  └─ shard[x] (m): tokenize\n"
             "                     ├─ report\n                     └─ stop_servers\n")
    tasks, edges = drawn_edges(wrong)
    assert tasks == set(DOWNSTREAM)
    assert ("preflight", "shard.tokenize") in edges
    assert edges != transitive_reduction(DOWNSTREAM)
