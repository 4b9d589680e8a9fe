"""Airflow plugin: a run that had nothing to do says so in its note.

Re-triggering a run whose shards are all complete skips everything after ``launch_servers``
and ends green; without a word, that looks like a run that did the work (issue 34).
``prepare_prompts`` says why in its log and leaves the sentence in XCom (key
``nothing_to_do``): a task cannot set its own run's note (Airflow 3.3's task API has no such
call, and the REST API would need a login on the worker). This listener runs where Airflow
decides a run's state (the scheduler, or ``airflow dags test``'s own process), with the
database session that decision is committed in, and copies the sentence into the run's note
unless someone already wrote one. The monitor shows the note beside the run.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

from include.dag_names import DAG_ID, PLAN_TASK

log = logging.getLogger(__name__)

NOTHING_TO_DO_KEY = "nothing_to_do"  # include/pipeline/prepare_prompts.py's NOTHING_TO_DO_KEY


def note_for(session: Any, dag_run: Any) -> str | None:
    """Return the ``nothing_to_do`` sentence ``prepare_prompts`` left for ``dag_run``, or None."""
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    row = session.execute(
        select(XComModel.value).where(
            XComModel.dag_id == dag_run.dag_id, XComModel.run_id == dag_run.run_id,
            XComModel.task_id == PLAN_TASK, XComModel.key == NOTHING_TO_DO_KEY,
            XComModel.map_index == -1)).first()
    return str(XComModel.deserialize_value(row)) if row is not None else None


def _write_note(session: Any, dag_run: Any) -> None:
    if dag_run.note:  # a person's note is kept
        return
    sentence = note_for(session, dag_run)
    if sentence:
        dag_run.note = sentence[:1000]  # the note's column holds 1,000 characters


@hookimpl
def on_dag_run_success(dag_run: Any, msg: str) -> None:
    """Note a finished run that had nothing to do (a note someone wrote is kept)."""
    if dag_run.dag_id != DAG_ID:
        return
    from sqlalchemy.orm import object_session

    try:
        session = object_session(dag_run)
        if session is not None:  # the scheduler's session: committed with the run's state
            _write_note(session, dag_run)
            return
        # A run no session holds (`airflow dags test` passes one): read and write it in a
        # transaction of our own.
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session

        with create_session() as own:
            run = own.get(DagRun, dag_run.id)
            if run is not None:
                _write_note(own, run)
    except Exception:  # noqa: BLE001 - a note is a courtesy: never fail the run's end
        log.warning("could not write the run's note from %s's %s", PLAN_TASK, NOTHING_TO_DO_KEY,
                    exc_info=True)


class RegenNotesPlugin(AirflowPlugin):
    name = "regen_notes"
    listeners = [sys.modules[__name__]]
