"""The DAG imports cleanly, opens no connection and touches no network while parsing."""

from __future__ import annotations

import socket
from pathlib import Path
from unittest import mock

import pytest

from include.dag_names import DAG_ID, PLAN_TASK, SHARD_TASKS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    def refuse(*args, **kwargs):
        raise AssertionError(f"network or connection use at parse time: {args!r}")

    with (
        mock.patch.object(socket.socket, "connect", refuse),
        mock.patch("airflow.sdk.BaseHook.get_connection", refuse),
    ):
        bag = DagBag(dag_folder=str(ROOT / "dags"))
    return bag


def test_dags_folder_holds_only_the_dag_file() -> None:
    files = sorted(p.name for p in (ROOT / "dags").iterdir() if p.suffix == ".py")
    assert files == ["evaluate_drafter.py", "regenerate_drafter_data.py"]


def test_dag_imports_without_errors_or_parse_time_connections(dagbag) -> None:
    assert dagbag.import_errors == {}
    assert DAG_ID in dagbag.dags and "evaluate_drafter" in dagbag.dags


def test_dag_documents_itself_and_has_the_trigger_form(dagbag) -> None:
    dag = dagbag.dags[DAG_ID]
    assert dag.doc_md and "drafter" in dag.doc_md
    assert "max_tokens" in dag.params and "sources" in dag.params


def test_the_ids_others_read_name_the_dags_tasks(dagbag) -> None:
    # The monitor, the run-note plugin and the slot check read these tasks by id
    # (include/dag_names.py): a task renamed in the DAG alone would leave them reading nothing.
    dag = dagbag.dags[DAG_ID]
    assert {PLAN_TASK, *SHARD_TASKS} <= set(dag.task_dict)


@pytest.mark.parametrize("name", ["regenerate_drafter_data.py", "evaluate_drafter.py"])
def test_dag_file_defers_heavy_imports_to_tasks(name: str) -> None:
    source = (ROOT / "dags" / name).read_text()
    top_level = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    heavy = ("datasets", "transformers", "aiohttp", "boto3", "include.prompts",
             "include.generation", "include.storage")
    assert not [line for line in top_level if any(h in line for h in heavy)]


@pytest.mark.parametrize("name", ["regenerate_drafter_data.py", "evaluate_drafter.py"])
def test_parsing_the_dag_imports_no_heavy_library(name: str) -> None:
    import subprocess
    import sys

    heavy = ["transformers", "datasets", "pyarrow", "boto3", "matplotlib", "include.prompts",
             "include.generation", "include.storage", "include.tokenization",
             "include.reporting.build", "numpy", "aiohttp", "include.evaluation.stats"]
    dag_file = str(ROOT / "dags" / name)
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('d', {dag_file!r})\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        f"print([m for m in {heavy!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                         check=True)
    assert out.stdout.strip() == "[]"


def test_the_run_state_is_decided_by_the_work_not_by_the_teardown(dagbag) -> None:
    # Airflow decides a run's state from its leaves; with the report upstream of the
    # teardown, a failed shard left the teardown as the only leaf and the run "succeeded".
    dag = dagbag.dags[DAG_ID]
    leaves = {t.task_id for t in dag.leaves}
    assert leaves == {"report", "stop_servers"}
    assert dag.task_dict["stop_servers"].is_teardown
    assert dag.task_dict["stop_servers"].on_failure_fail_dagrun
    assert "shard.tokenize" in dag.task_dict["report"].upstream_task_ids


def test_shard_tasks_are_named_from_the_arguments_they_are_called_with(dagbag) -> None:
    # A map_index_template reads the task's own keyword arguments: a positional call would
    # leave op_kwargs empty and fail the task after its work was done.
    dag = dagbag.dags[DAG_ID]
    for task_id in SHARD_TASKS:
        task = dag.task_dict[task_id]
        assert "task.op_kwargs['shard_id']" in task.map_index_template
        assert {"shard_id", "split"} <= set(task.op_kwargs) and not task.op_args, task_id



def test_shards_queued_ahead_wait_set_up_beside_those_generating(dagbag) -> None:
    # Airflow lets REGEN_MAX_ACTIVE_SHARDS generate tasks run plus two queued ahead (they set
    # up, then wait inside the task for a slot: include.generation.shard.wait_for_slot); the
    # task passes its own map index to the slot check through the ``ti`` Airflow injects.
    import os

    generate = dagbag.dags[DAG_ID].task_dict["shard.generate"]
    assert generate.max_active_tis_per_dagrun == int(
        os.environ.get("REGEN_MAX_ACTIVE_SHARDS", "3")) + 2
    assert "ti" in generate.python_callable.__code__.co_varnames[
        :generate.python_callable.__code__.co_argcount]
