"""Airflow plugin: a page listing drafter-data runs with their live progress and reports.

Mounted in the API server at ``/regen-monitor`` (``fastapi_apps``) and linked from the UI's
navigation (``external_views``, shown in an iframe under Browse). It reads the runs' own
manifests and journals under the deployment's ``output_root`` (``REGEN_OUTPUT_ROOT``) through
``include.storage``, read-only, with the deployment's ``s3_conn_id`` for an s3:// root (and
probes the ``/health`` of the deployment's own servers only, ``REGEN_GPU_HOSTS``), and
what Airflow scheduled for them from Airflow's own database (``query_runs``, made sense of by
``include.monitor.states``: each run's state, its shards running / queued / failed /
done, with links to the run and to each shard's task log in the UI). The page has no state of
its own.

Airflow mounts a plugin's app without its own authentication, so every route here requires
what the DAG's run pages require: a signed-in Airflow user (the UI's ``_token`` cookie or an
``Authorization: Bearer`` token, checked by Airflow's own dependency) allowed to read the
DAG's runs. A browser opening the page without a session is sent to the login page and back;
any other caller gets 401. FastAPI's ``/docs``, ``/redoc`` and ``/openapi.json`` are off: the
routes are this page's, not a public API.

Every Airflow component imports plugins (each task process too, for macros and listeners), and
Airflow's security module costs about 1.5 s to import, so the app is built on its first request
in the API server (``LazyApp``) rather than at import.
"""

from __future__ import annotations

import json
import logging
from functools import cache
from pathlib import Path
from typing import Any

from airflow.plugins_manager import AirflowPlugin
from cachetools import LRUCache
from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

log = logging.getLogger(__name__)
URL_PREFIX = "/regen-monitor"
#: Failed attempts whose reason was read from their log (a finished attempt's log is final).
_FAILURES: LRUCache[tuple[str, str, str, int, int], tuple[str, list[str]]] = LRUCache(256)


def output_root() -> str:
    """Return the output location the page lists runs under (the deployment's output root)."""
    from include.settings import DeploymentSettings

    return DeploymentSettings.load().output_root


@cache
def _monitor() -> Any:
    from include.monitor.runs import RunMonitor
    from include.servers.launch_report import server_addresses
    from include.settings import DeploymentSettings
    from include.storage import open_store

    deployment = DeploymentSettings.load()
    store = open_store(deployment.output_root, read_only=True,
                       s3_conn_id=deployment.s3_conn_id)
    # Journals name servers by URL; only the deployment's own hosts and ports are probed.
    return RunMonitor(store, own_servers=server_addresses(deployment))


def _ui_base() -> str:
    """Return the path the Airflow UI is served under (``[api] base_url``'s path, or "")."""
    from urllib.parse import urlsplit

    from airflow.configuration import conf

    return urlsplit(conf.get("api", "base_url", fallback="") or "").path.rstrip("/")


def _text(state: Any) -> str | None:
    """Return a state as its plain value (the ORM may hand back Airflow's state enums)."""
    return None if state is None else str(getattr(state, "value", state))


@cache
def state_words() -> dict[str, str]:
    """Return the word Airflow's UI shows for each run and task state, from Airflow itself.

    The values are Airflow's own (``DagRunState``, ``TaskInstanceState``); the words are
    those of the installed UI's English table (``states`` in its ``common.json``).
    """
    import airflow
    from airflow.utils.state import DagRunState, TaskInstanceState

    from include.monitor.states import ui_words

    table = Path(airflow.__file__).parent / "ui" / "dist" / "i18n" / "locales" / "en"
    try:
        translations = json.loads((table / "common.json").read_text())["states"]
    except (OSError, ValueError, KeyError):
        translations = {}  # an Airflow without its UI files: the values, spelled as the UI
    return ui_words([*(s.value for s in TaskInstanceState), *(s.value for s in DagRunState)],
                    translations)


def _failure_of(ti: Any) -> dict[str, Any]:
    """Return a failed task instance's reason, read once from its log (then kept)."""
    from airflow.utils.log.log_reader import TaskLogReader

    from include.monitor.states import first_failure

    key = (ti.dag_id, ti.run_id, ti.task_id, ti.map_index, ti.try_number)
    if key not in _FAILURES:
        try:
            stream, _ = TaskLogReader().read_log_chunks(ti, ti.try_number,
                                                        {"download_logs": True})
            events = [m.model_dump() if hasattr(m, "model_dump") else dict(m) for m in stream]
            _FAILURES[key] = first_failure(events)
        except Exception as exc:  # noqa: BLE001 - the page shows the rest, and a link to the log
            log.warning("monitor: could not read the log of %s", key, exc_info=True)
            return {"task_id": ti.task_id, "map_index": ti.map_index, "lines": [],
                    "message": f"(its log could not be read: {type(exc).__name__})"}
    message, lines = _FAILURES[key]
    return {"task_id": ti.task_id, "map_index": ti.map_index, "message": message,
            "lines": lines}


def query_runs(dag_id: str, ui_base: str = "", limit: int | None = None,
               with_reasons: bool = True) -> list[dict[str, Any]]:
    """Return the DAG's ``limit`` newest runs, newest first, summarized (``summarize_run``).

    Reads Airflow's metadata database through its ORM: the page runs inside the API server,
    which already holds that database session (the REST API would be a call from the server
    to itself). ``limit`` defaults to ``RECENT_RUNS``. With ``with_reasons`` (the user may
    read task logs), a run with a failed task carries the first one's reason, from its log.
    """
    from airflow.models.dagrun import DagRun, DagRunNote
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from airflow.utils.state import State, TaskInstanceState
    from sqlalchemy import select
    from sqlalchemy.orm import joinedload

    from include.dag_names import PLAN_TASK, SHARD_TASKS
    from include.monitor.states import RECENT_RUNS, TaskRow, summarize_run
    from include.settings import RunSettings

    limit = RECENT_RUNS if limit is None else limit
    default_name = RunSettings.model_fields["run_name"].default
    with create_session() as session:
        runs = session.execute(
            select(DagRun.id, DagRun.run_id, DagRun.state.label("state"), DagRun.conf,
                   DagRun.start_date)
            .where(DagRun.dag_id == dag_id).order_by(DagRun.id.desc()).limit(limit)).all()
        run_ids = [r.run_id for r in runs]
        # A run's note (plugins/regen_notes.py's "nothing to do", or a person's) is shown too.
        notes = dict(session.execute(
            select(DagRunNote.dag_run_id, DagRunNote.content)
            .where(DagRunNote.dag_run_id.in_([r.id for r in runs]))).all())
        tasks: dict[str, list[TaskRow]] = {}
        for row in session.execute(
                select(TaskInstance.run_id, TaskInstance.task_id, TaskInstance.map_index,
                       TaskInstance.state,
                       TaskInstance.rendered_map_index.label("rendered_map_index"))
                .where(TaskInstance.dag_id == dag_id, TaskInstance.run_id.in_(run_ids),
                       TaskInstance.task_id.in_(SHARD_TASKS), TaskInstance.map_index >= 0)):
            tasks.setdefault(row.run_id, []).append(
                TaskRow(row.task_id, row.map_index, _text(row.state), row.rendered_map_index))
        plans = {row.run_id: XComModel.deserialize_value(row) for row in session.execute(
            select(XComModel.run_id, XComModel.value)
            .where(XComModel.dag_id == dag_id, XComModel.run_id.in_(run_ids),
                   XComModel.task_id == PLAN_TASK, XComModel.key == "return_value",
                   XComModel.map_index == -1))}
        failures: dict[str, dict[str, Any]] = {}
        # The first task that failed (not those failed because it did): why the run failed.
        for ti in session.scalars(
                select(TaskInstance).options(joinedload(TaskInstance.dag_run))
                .where(TaskInstance.dag_id == dag_id, TaskInstance.run_id.in_(run_ids),
                       TaskInstance.state == TaskInstanceState.FAILED)
                .order_by(TaskInstance.end_date)):
            if ti.run_id not in failures:
                failures[ti.run_id] = (_failure_of(ti) if with_reasons else
                                       {"task_id": ti.task_id, "map_index": ti.map_index,
                                        "message": "", "lines": []})
    return [summarize_run(
        dag_id, {"run_id": r.run_id, "state": _text(r.state), "conf": r.conf,
                 "live": r.state in State.unfinished_dr_states,
                 "start_date": r.start_date.isoformat() if r.start_date else None,
                 "note": notes.get(r.id)},
        tasks.get(r.run_id, ()), plans.get(r.run_id), ui_base, default_name,
        failures.get(r.run_id)) for r in runs]


def page_state(with_reasons: bool = True) -> dict[str, Any]:
    """Return what the page shows: the runs' files, with Airflow's runs attached to them.

    Airflow's side failing (its database busy or unreachable) leaves the rest of the page
    working; the error is shown instead of the runs' states.
    """
    from include.dag_names import DAG_ID
    from include.monitor.states import attach

    error = None
    try:
        airflow_runs = query_runs(DAG_ID, _ui_base(), with_reasons=with_reasons)
    except Exception as exc:  # noqa: BLE001 - any failure: show the files, say what failed
        log.warning("monitor: could not read the runs of %s from Airflow", DAG_ID,
                    exc_info=True)
        airflow_runs, error = [], f"{type(exc).__name__}: {exc}"
    runs, others = attach(_monitor().live_runs(), airflow_runs)
    return {"output_root": output_root(), "runs": runs, "other_airflow_runs": others,
            "airflow_error": error, "state_words": state_words()}


def _may_read_logs(user: Any) -> bool:
    """Return whether ``user`` may read the DAG's task logs (failure reasons come from them)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        DagAccessEntity,
        DagDetails,
    )

    from include.dag_names import DAG_ID

    return get_auth_manager().is_authorized_dag(
        method="GET", user=user, access_entity=DagAccessEntity.TASK_LOGS,
        details=DagDetails(id=DAG_ID))


async def _login_first(request: Request, exc: HTTPException) -> Response:
    """Send a browser without a valid session to the login page, then back here."""
    from airflow.api_fastapi.app import get_auth_manager

    navigating = "text/html" in request.headers.get("accept", "")
    if exc.status_code == 401 and navigating and request.method == "GET":
        return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)),
                                status_code=303)
    return await http_exception_handler(request, exc)


def create_app() -> FastAPI:
    """Return the monitor's FastAPI app (mounted by Airflow under ``URL_PREFIX``)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import get_user, requires_access_dag
    from fastapi import Depends

    from include.dag_names import DAG_ID
    from include.monitor.page import render_page
    from include.monitor.runs import REPORT_MEDIA_TYPES, is_report_file

    app = FastAPI(
        title="Drafter data run monitor", docs_url=None, redoc_url=None, openapi_url=None,
        # The permission of the DAG's own run pages: whoever may read its runs may watch them.
        dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN, DAG_ID))])
    app.add_exception_handler(HTTPException, _login_first)  # type: ignore[arg-type]

    @app.get("/", response_class=HTMLResponse)
    def page(user: Any = Depends(get_user)) -> str:  # noqa: B008 - FastAPI's own idiom
        state = page_state(with_reasons=_may_read_logs(user))
        return render_page(state, state["state_words"], _ui_base(), URL_PREFIX)

    @app.get("/api/runs")
    def runs(user: Any = Depends(get_user)) -> JSONResponse:  # noqa: B008
        return JSONResponse(page_state(with_reasons=_may_read_logs(user)))

    @app.get("/files/{key:path}")
    def report_file(key: str) -> Response:
        # Only report folders are served: never prompts, journals or training data.
        if not is_report_file(key):
            raise HTTPException(404, "only files of a run's report/<run id>/ folder are served")
        store = _monitor().store
        if not store.exists(key):
            raise HTTPException(404, f"{key} does not exist")
        return Response(store.read(key), media_type=REPORT_MEDIA_TYPES[key.rsplit(".", 1)[-1]])

    return app


class LazyApp:
    """An ASGI app that builds the monitor app (``create_app``) on its first request."""

    def __init__(self) -> None:
        self._app: FastAPI | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            self._app = create_app()
        await self._app(scope, receive, send)


class RegenMonitorPlugin(AirflowPlugin):
    """Register the monitor app and its navigation entry."""

    name = "regen_monitor"
    fastapi_apps = [{"app": LazyApp(), "url_prefix": URL_PREFIX, "name": "Drafter data runs"}]
    external_views = [{"name": "Drafter data runs", "href": URL_PREFIX + "/",
                       "url_route": "regen-monitor", "destination": "nav",
                       "category": "browse"}]


__all__ = ["LazyApp", "RegenMonitorPlugin", "create_app", "page_state", "state_words"]
