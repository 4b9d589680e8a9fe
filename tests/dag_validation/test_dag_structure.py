"""The DAG's shape: each task's downstream tasks, one call per task body, what parsing imports.

The structure is the pipeline's contract with Airflow (task ids, the shard group's chain, the
report and the teardown as leaves); parsing is the dag-processor's cost, paid on every parse.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DAG_FILE = ROOT / "dags" / "regenerate_drafter_data.py"
DAG_ID = "regenerate_drafter_data"

#: Each task's downstream task ids. XCom arguments are edges too: the plan reaches the
#: launch, the preflight, the shard group and the report; the launch report reaches the
#: gate's targets, the preflight, the report and the teardown.
DOWNSTREAM = {
    "check_settings": {"prepare_prompts"},
    "prepare_prompts": {"launch_servers", "preflight", "shard.generate", "shard.upload",
                        "shard.tokenize", "report"},
    "launch_servers": {"health_targets", "preflight", "report", "stop_servers"},
    "health_targets": {"wait_for_server"},
    "wait_for_server": {"preflight"},
    "preflight": {"shard.generate"},
    "shard.generate": {"shard.upload"},
    "shard.upload": {"shard.tokenize"},
    "shard.tokenize": {"report", "stop_servers"},
    "report": set(),
    "stop_servers": set(),
}
#: Libraries no DAG parse needs (each costs the dag-processor time on every parse) and the
#: stages, which tasks import when they run.
HEAVY = ("aiohttp", "transformers", "tokenizers", "huggingface_hub", "datasets", "pyarrow",
         "pandas", "numpy", "boto3", "botocore", "matplotlib", "paramiko", "asyncssh",
         "include.pipeline", "include.prompts", "include.generation", "include.storage",
         "include.tokenization", "include.reporting.build", "include.servers.triggers")


@pytest.fixture(scope="module")
def dag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags")).dags[DAG_ID]


def test_each_task_has_exactly_its_downstream_tasks(dag) -> None:
    actual = {task_id: set(task.downstream_task_ids) for task_id, task in dag.task_dict.items()}
    assert actual == DOWNSTREAM


def test_every_task_body_is_one_call_into_its_pipeline_module() -> None:
    tree = ast.parse(DAG_FILE.read_text())
    bodies = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Name | ast.Call | ast.Attribute) for d in node.decorator_list):
            statements = [s for s in node.body if not (
                isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]  # docstring
            if statements and isinstance(statements[0], ast.ImportFrom):
                bodies[node.name] = statements
    assert set(bodies) == {"check_settings", "prepare_prompts", "launch_servers",
                           "health_targets", "preflight", "generate", "upload", "tokenize",
                           "report", "stop_servers"}
    for name, (imported, call, *rest) in bodies.items():
        assert not rest, f"{name}: more than one import and one call"
        assert imported.module.startswith("include.pipeline."), name
        value = call.value if isinstance(call, ast.Return | ast.Expr) else None
        assert isinstance(value, ast.Call), f"{name}: its second statement is not a call"


def _parse_in_a_fresh_interpreter(env: dict[str, str]) -> dict:
    """Parse the DAG file in a new Python; return the modules parsing imported and facts."""
    code = (
        "import importlib.util, json, sys\n"
        "before = set(sys.modules)\n"
        f"spec = importlib.util.spec_from_file_location('d', {str(DAG_FILE)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "print(json.dumps({'imported': sorted(set(sys.modules) - before),\n"
        "                  'max_active_shards': module.MAX_ACTIVE_SHARDS,\n"
        "                  'defer_health_gate': module.DEFER_HEALTH_GATE}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=False,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_parsing_the_dag_imports_no_heavy_library_and_no_stage() -> None:
    imported = _parse_in_a_fresh_interpreter({})["imported"]
    assert "airflow.sdk" in imported and "include.servers.sensor" in imported  # it did parse
    heavy = sorted(m for m in imported if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == []


def test_parse_time_values_come_from_the_deployment_settings() -> None:
    # "0" is false, as pydantic reads it everywhere else (it used to mean "defer" here).
    parsed = _parse_in_a_fresh_interpreter({"REGEN_DEFER_HEALTH_GATE": "0",
                                            "REGEN_MAX_ACTIVE_SHARDS": "5"})
    assert (parsed["defer_health_gate"], parsed["max_active_shards"]) == (False, 5)
    default = _parse_in_a_fresh_interpreter({})
    assert (default["defer_health_gate"], default["max_active_shards"]) == (True, 3)


def test_a_wrong_parse_time_value_fails_the_parse_naming_the_variable() -> None:
    with pytest.raises(AssertionError, match="REGEN_MAX_ACTIVE_SHARDS"):
        _parse_in_a_fresh_interpreter({"REGEN_MAX_ACTIVE_SHARDS": "0"})
