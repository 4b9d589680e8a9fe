"""The shape of ``include/``: layers that import only downwards, no import circle anywhere,
stages free of Airflow, no module too long to read in one go.

Imports are read from the source (``ast``), inside functions too: a lazy import that closes a
circle (or reaches up a layer) only hides it until the day someone moves it to the top.
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
    assert graph.has_edge("include.pipeline.check_settings", "include.servers.expectations")
    assert any(target.startswith("include.storage")
               for target in graph["include.settings.validation"])


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


#: The layers of ``include/``, top first: a module imports its own layer or lower ones only.
#: Stages import each other (generation reads prompt shards; reporting reads journals).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("include.pipeline",),
    # The stages, on four floors. A floor's packages import only floors below, never each
    # other: the shard stage, the run monitor and drafter evaluation read everything below;
    # preparation, reporting and the launcher; the engine and tokenization; at the bottom
    # what they all keep and judge (conversations, durability, quality).
    ("include.generation", "include.monitor", "include.evaluation"),
    ("include.prompts", "include.reporting", "include.servers"),
    ("include.engine", "include.tokenization"),
    ("include.conversations", "include.durability", "include.quality"),
    ("include.settings",),
    # What every stage speaks to an SGLang server with (settings read the servers' API key
    # through its hook): below settings, above storage.
    ("include.sglang",),
    ("include.storage",),
    # Leaves any stage may import: every store key, the target's tokenizer, JSON lines, the
    # words for how things ended (include/outcomes.py), the DAG and task ids.
    ("include.layout", "include.target_tokenizer", "include.jsonl", "include.outcomes",
     "include.dag_names"),
)
#: Upward imports that are right, each with its reason: none (the engine's command-line
#: front end lives in the pipeline layer, ``include/pipeline/shard_cli.py``).
UPWARD_EXCEPTIONS: dict[tuple[str, str], str] = {}

#: Where a stage (or settings, storage, layout) may import Airflow, and why.
AIRFLOW_ALLOWED = {
    "include.servers.sensor": "the health gate is an Airflow sensor",
    "include.servers.triggers": "its trigger, run in the triggerer",
    "include.servers.hosts": "SSHHook: the hook that wraps the hosts' SSH connections",
    "include.storage.s3_client": "S3Hook: the hook that wraps the S3 connection",
    "include.sglang.hook": "SGLangHook: the hook that wraps the servers' API key connection",
    "include.settings.params": "builds the trigger form's Params from the run settings",
}


def layer_of(module: str) -> int | None:
    """Return the index in ``LAYERS`` of a module's layer (None: a module of no layer)."""
    for index, packages in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in packages):
            return index
    return None


def package_of(module: str) -> str:
    """Return the package of ``include`` a module is in (``include.engine.pool``: engine)."""
    return ".".join(module.split(".")[:2])


def upward_imports(graph: nx.DiGraph) -> list[tuple[str, str]]:
    """Return every import of a module by one in a lower layer, or by one of another package
    on the same floor (siblings do not import each other), less the exceptions."""
    return sorted(
        (a, b) for a, b in graph.edges
        if (la := layer_of(a)) is not None and (lb := layer_of(b)) is not None
        and (lb < la or (lb == la and package_of(a) != package_of(b)
                         and len(LAYERS[la]) > 1 and la != len(LAYERS) - 1))
        and (a, b) not in UPWARD_EXCEPTIONS)


def package_cycles(graph: nx.DiGraph) -> list[list[str]]:
    """Return the groups of ``include`` packages that import each other round a circle."""
    packages = nx.DiGraph()
    packages.add_edges_from((package_of(a), package_of(b)) for a, b in graph.edges
                            if package_of(a) != package_of(b))
    return sorted(sorted(c) for c in nx.strongly_connected_components(packages) if len(c) > 1)


def airflow_importers(root: Path = INCLUDE) -> dict[str, int]:
    """Return each ``include`` module importing ``airflow`` (lazily too), with a line of it."""
    found = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "airflow" or n.startswith("airflow.") for n in names):
                found.setdefault(_module_name(path), node.lineno)
    return found


def test_every_package_of_include_is_in_a_layer() -> None:
    unplaced = sorted({m for m in import_graph() if layer_of(m) is None} - {"include"})
    assert not unplaced, f"place these in a layer of LAYERS (test_house.py): {unplaced}"


def test_no_layer_imports_a_higher_one() -> None:
    up = upward_imports(import_graph())
    assert not up, (
        "imports up the layers (pipeline > four floors of stages > settings > sglang > storage > "
        "leaves), or between siblings of a floor; move "
        f"the code down, or pass the answer in as an argument: {up}")


def test_the_layer_rule_catches_an_upward_import() -> None:
    graph = nx.DiGraph([("include.storage.store", "include.settings.run"),
                        ("include.prompts.plan", "include.pipeline.binding"),
                        ("include.pipeline.prepare_prompts", "include.prompts.plan"),
                        ("include.generation.shard", "include.prompts")])
    assert upward_imports(graph) == [("include.prompts.plan", "include.pipeline.binding"),
                                     ("include.storage.store", "include.settings.run")]
    # Every arrow points down: the layering has no exceptions to name.
    assert UPWARD_EXCEPTIONS == {}


def test_no_package_import_circle() -> None:
    circles = package_cycles(import_graph())
    assert not circles, (
        "packages of include/ importing each other round a circle (move the vocabulary or "
        f"reader they share a floor down): {circles}")


def test_the_floor_and_circle_rules_catch_a_planted_import() -> None:
    up = nx.DiGraph([("include.durability.journal", "include.engine.outcome"),
                     ("include.engine.pool", "include.durability.journal"),
                     ("include.prompts.rows", "include.reporting.card"),
                     ("include.generation.shard", "include.engine.dispatch")])
    assert upward_imports(up) == [("include.durability.journal", "include.engine.outcome"),
                                  ("include.prompts.rows", "include.reporting.card")]
    assert package_cycles(up) == [["include.durability", "include.engine"]]


def test_only_the_pipeline_and_the_hooks_import_airflow() -> None:
    importers = airflow_importers()
    assert importers, "the scan finds the pipeline's own Airflow imports"
    stray = {m: line for m, line in importers.items()
             if layer_of(m) != 0 and m not in AIRFLOW_ALLOWED}
    assert not stray, (
        "stage, settings and storage modules importing Airflow (ask Airflow in include/pipeline "
        f"and pass the answer in; module: line): {stray}")
    gone = sorted(set(AIRFLOW_ALLOWED) - set(importers))
    assert not gone, f"no longer import Airflow: drop them from AIRFLOW_ALLOWED: {gone}"


#: Folders of ``tests/unit`` that test no package of the same name in ``include/``, and why.
#: (``tests/unit/sglang`` tests ``include/sglang``: no exception needed.)
UNIT_FOLDER_EXCEPTIONS: dict[str, str] = {}


def misplaced_unit_tests(tests: Path = ROOT / "tests" / "unit",
                         include: Path = INCLUDE) -> list[str]:
    """Return the unit test folders naming no ``include`` package, and the files of
    ``tests/unit/pipeline`` naming no module of ``include/pipeline`` (``test_<module>*.py``)."""
    out = [f"tests/unit/{d.name}/" for d in sorted(tests.iterdir())
           if d.is_dir() and d.name != "__pycache__" and d.name not in UNIT_FOLDER_EXCEPTIONS
           and not (include / d.name / "__init__.py").is_file()]
    modules = {p.stem for p in (include / "pipeline").glob("*.py")} - {"__init__"}
    out += [f"tests/unit/pipeline/{f.name}" for f in sorted((tests / "pipeline").glob("test_*.py"))
            if not any(f.stem == f"test_{m}" or f.stem.startswith(f"test_{m}_")
                       for m in modules)]
    return out


def test_unit_tests_follow_the_modules_they_test(tmp_path) -> None:
    misplaced = misplaced_unit_tests()
    assert not misplaced, (
        "unit tests not named after what they test: a folder per include/ package, and in "
        "tests/unit/pipeline test_<module>.py per include/pipeline module (move them, or list "
        f"a folder in UNIT_FOLDER_EXCEPTIONS with its reason): {misplaced}")
    (tmp_path / "include" / "pipeline").mkdir(parents=True)
    (tmp_path / "include" / "pipeline" / "__init__.py").touch()
    (tmp_path / "include" / "pipeline" / "plan.py").touch()
    for path in ("pipeline/test_plan.py", "pipeline/test_plan_waits.py",
                 "pipeline/test_planner.py", "prompts/test_x.py"):
        (tmp_path / "unit" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "unit" / path).touch()
    assert misplaced_unit_tests(tmp_path / "unit", tmp_path / "include") == [
        "tests/unit/prompts/", "tests/unit/pipeline/test_planner.py"]
