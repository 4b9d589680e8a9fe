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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

log = logging.getLogger(__name__)

DAG_ID = "regenerate_drafter_data"
PLAN_TASK = "prepare_prompts"
NOTHING_TO_DO_KEY = "nothing_to_do"  # include/pipeline/prepare_prompts.py's NOTHING_TO_DO_KEY


def note_for(dag_run: Any) -> str | None:
    """Return the ``nothing_to_do`` sentence ``prepare_prompts`` left for ``dag_run``, or None."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select
    from sqlalchemy.orm import object_session

    # The session deciding the run's state when there is one (SQLite: no second connection
    # waiting on the first one's lock).
    session = object_session(dag_run)
    with create_session() if session is None else _as_is(session) as session:
        row = session.execute(
            select(XComModel.value).where(
                XComModel.dag_id == dag_run.dag_id, XComModel.run_id == dag_run.run_id,
                XComModel.task_id == PLAN_TASK, XComModel.key == NOTHING_TO_DO_KEY,
                XComModel.map_index == -1)).first()
    return str(XComModel.deserialize_value(row)) if row is not None else None


@contextmanager
def _as_is(session: Any) -> Iterator[Any]:
    yield session


@hookimpl
def on_dag_run_success(dag_run: Any, msg: str) -> None:
    """Note a finished run that had nothing to do (a note someone wrote is kept)."""
    if dag_run.dag_id != DAG_ID or dag_run.note:
        return
    try:
        sentence = note_for(dag_run)
    except Exception:  # noqa: BLE001 - a note is a courtesy: never fail the scheduler's loop
        log.exception("could not read %s's %s for the run's note", PLAN_TASK, NOTHING_TO_DO_KEY)
        return
    if sentence:
        dag_run.note = sentence[:1000]  # committed with the run's new state (1,000 at most)


class RegenNotesPlugin(AirflowPlugin):
    name = "regen_notes"
    listeners = [sys.modules[__name__]]
