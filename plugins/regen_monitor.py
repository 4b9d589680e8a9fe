"""Airflow plugin: a page listing drafter-data runs with their live progress and reports.

Mounted in the API server at ``/regen-monitor`` (``fastapi_apps``) and linked from the UI's
navigation (``external_views``, shown in an iframe under Browse). It reads the runs' own
manifests and journals under the deployment's ``output_root`` (``REGEN_OUTPUT_ROOT``) through
``include.storage``, read-only, with the deployment's ``s3_conn_id`` for an s3:// root (and
probes the ``/health`` of the deployment's own servers only, ``REGEN_GPU_HOSTS``), and
what Airflow scheduled for them from Airflow's own database (``query_runs``, made sense of by
``include.reporting.airflow_runs``: each run's state, its shards running / queued / failed /
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

import html
import logging
import time
from functools import cache
from typing import Any

from airflow.plugins_manager import AirflowPlugin
from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

log = logging.getLogger(__name__)
URL_PREFIX = "/regen-monitor"
REFRESH_S = 10


def output_root() -> str:
    """Return the output location the page lists runs under (the deployment's output root)."""
    from include.settings import DeploymentSettings

    return DeploymentSettings.load().output_root


@cache
def _monitor() -> Any:
    from include.reporting.monitor import RunMonitor
    from include.servers.report import server_addresses
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


def query_runs(dag_id: str, ui_base: str = "", limit: int | None = None
               ) -> list[dict[str, Any]]:
    """Return the DAG's ``limit`` newest runs, newest first, summarized (``summarize_run``).

    Reads Airflow's metadata database through its ORM: the page runs inside the API server,
    which already holds that database session (the REST API would be a call from the server
    to itself). ``limit`` defaults to ``RECENT_RUNS``.
    """
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from include.reporting.airflow_runs import (
        PLAN_TASK,
        RECENT_RUNS,
        SHARD_TASKS,
        TaskRow,
        summarize_run,
    )
    from include.settings import RunSettings

    limit = RECENT_RUNS if limit is None else limit
    default_name = RunSettings.model_fields["run_name"].default
    with create_session() as session:
        runs = session.execute(
            select(DagRun.run_id, DagRun.state.label("state"), DagRun.conf, DagRun.start_date)
            .where(DagRun.dag_id == dag_id).order_by(DagRun.id.desc()).limit(limit)).all()
        run_ids = [r.run_id for r in runs]
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
    return [summarize_run(
        dag_id, {"run_id": r.run_id, "state": _text(r.state), "conf": r.conf,
                 "start_date": r.start_date.isoformat() if r.start_date else None},
        tasks.get(r.run_id, ()), plans.get(r.run_id), ui_base, default_name) for r in runs]


def page_state() -> dict[str, Any]:
    """Return what the page shows: the runs' files, with Airflow's runs attached to them.

    Airflow's side failing (its database busy or unreachable) leaves the rest of the page
    working; the error is shown instead of the runs' states.
    """
    from include.reporting.airflow_runs import attach
    from include.reporting.monitor import DAG_ID

    error = None
    try:
        airflow_runs = query_runs(DAG_ID, _ui_base())
    except Exception as exc:  # noqa: BLE001 - any failure: show the files, say what failed
        log.warning("monitor: could not read the runs of %s from Airflow", DAG_ID,
                    exc_info=True)
        airflow_runs, error = [], f"{type(exc).__name__}: {exc}"
    runs, others = attach(_monitor().live_runs(), airflow_runs)
    return {"output_root": output_root(), "runs": runs, "other_airflow_runs": others,
            "airflow_error": error}


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


# Airflow 3.3's own colour tokens (Chakra semantic tokens of its UI, light and dark), so the
# page reads as part of the UI; the state colours are Airflow's task-state colours.
_TOKENS = {
    "light": {"bg": "#FFFFFF", "bg-subtle": "oklch(0.985 0.004 253)",
              "bg-muted": "oklch(0.955 0.006 253)", "fg": "oklch(0.23185 0.0323 266.44)",
              "fg-muted": "oklch(0.45 0.055 251)", "border": "oklch(0.915 0.01 253)",
              "link": "oklch(0.424 0.199 265.638)", "ok": "oklch(0.448 0.119 151.328)",
              "bad": "oklch(0.444 0.177 26.899)"},
    "dark": {"bg": "oklch(0.23185 0.0323 266.44)", "bg-subtle": "oklch(0.11 0.025 251)",
             "bg-muted": "oklch(0.18 0.03 251)", "fg": "oklch(0.985 0.004 253)",
             "fg-muted": "oklch(0.75 0.025 252)", "border": "oklch(0.28 0.035 251)",
             "link": "oklch(0.882 0.059 254.128)", "ok": "oklch(0.925 0.084 155.995)",
             "bad": "oklch(0.885 0.062 18.334)"},
}
_STATES = {"success": "oklch(0.47 0.20 149.0)", "failed": "oklch(0.577 0.245 27.325)",
           "running": "oklch(0.609 0.126 221.723)", "queued": "oklch(0.444 0.011 73.639)",
           "up_for_retry": "oklch(0.681 0.162 75.834)"}
_CSS = (
    ":root{color-scheme:light;" + "".join(f"--{k}:{v};" for k, v in _TOKENS["light"].items())
    + "".join(f"--{k}:{v};" for k, v in _STATES.items()) + "}"
    ":root.dark{color-scheme:dark;" + "".join(f"--{k}:{v};" for k, v in _TOKENS["dark"].items())
    + "}"
    "body{margin:0;padding:16px 24px;background:var(--bg);color:var(--fg);font:14px/1.5 Inter,"
    "-apple-system,BlinkMacSystemFont,'Segoe UI',Helvetica,Arial,sans-serif}"
    "h1{font-size:20px;font-weight:600;margin:0 0 4px}h2{font-size:16px;margin:0}"
    "a{color:var(--link)}.muted{color:var(--fg-muted);font-size:13px}"
    ".run{border:1px solid var(--border);border-radius:8px;margin:16px 0;overflow:hidden}"
    ".run>header{display:flex;gap:12px;align-items:center;flex-wrap:wrap;padding:10px 16px;"
    "background:var(--bg-subtle);border-bottom:1px solid var(--border)}"
    ".badge{border-radius:999px;padding:0 10px;font-size:12px;color:#fff;"
    "background:var(--queued)}.badge.generating{background:var(--running)}"
    ".badge.complete{background:var(--success)}.badge.idle{background:var(--up_for_retry)}"
    ".stats{display:grid;grid-template-columns:repeat(auto-fill,minmax(116px,1fr));gap:8px;"
    "padding:12px 16px}.stat{background:var(--bg-muted);border-radius:6px;padding:6px 10px}"
    ".stat .v{display:block;font-size:18px;font-weight:600}"
    ".stat .k{color:var(--fg-muted);font-size:12px}"
    ".part{padding:0 16px 12px}.part h3{font-size:13px;margin:4px 0;color:var(--fg-muted)}"
    ".chip{display:inline-flex;gap:6px;align-items:center;border:1px solid var(--border);"
    "border-left:4px solid var(--queued);border-radius:4px;padding:1px 8px;margin:2px;"
    "font:12px ui-monospace,monospace}.chip.generating{border-left-color:var(--running)}"
    ".chip.tokenizing{border-left-color:var(--up_for_retry)}"
    ".bar{width:60px;height:6px;background:var(--bg-muted);border-radius:3px;overflow:hidden}"
    ".bar i{display:block;height:100%;background:var(--running)}"
    ".ok{color:var(--ok)}.bad{color:var(--bad)}"
    # Airflow's runs: run state badges and shard chips in Airflow's task-state colours.
    ".badge.af-running{background:var(--running)}.badge.af-success{background:var(--success)}"
    ".badge.af-failed{background:var(--failed)}a.badge{text-decoration:none}"
    ".afrun{margin:2px 0 6px}.afrun>div{margin:2px 0}a.chip{color:inherit;text-decoration:none}"
    ".chip.running{border-left-color:var(--running)}.chip.failed{border-left-color:var(--failed)}"
    ".chip.done{border-left-color:var(--success)}summary{cursor:pointer}")
# Follow the colour mode of the Airflow UI framing the page (its <html> class, live), else the
# one the UI stored ("theme" in this origin's localStorage), else the system's.
_COLOUR_MODE_JS = (
    "(function(){var r=document.documentElement,m=matchMedia('(prefers-color-scheme: dark)');"
    "function p(){try{return window.parent!==window&&window.parent.document.documentElement}"
    "catch(e){return null}}"
    "function dark(){var h=p();if(h&&/\\b(dark|light)\\b/.test(h.className))"
    "return h.classList.contains('dark');var t=null;try{t=localStorage.getItem('theme')}"
    "catch(e){}return t==='dark'||(t!=='light'&&m.matches)}"
    "function apply(){var d=dark();r.classList.toggle('dark',d);r.classList.toggle('light',!d)}"
    "apply();m.addEventListener('change',apply);var h=p();if(h)new MutationObserver(apply)"
    ".observe(h,{attributes:true,attributeFilter:['class']})})();")
# Refresh the runs in place (no flash, scroll kept); a lost session reloads into the login.
_REFRESH_JS = (
    f"setInterval(function(){{fetch(location.href,{{headers:{{Accept:'text/html'}}}})"
    ".then(function(r){if(!r.ok||r.redirected){location.reload();return null}return r.text()})"
    ".then(function(t){if(!t)return;var d=new DOMParser().parseFromString(t,'text/html');"
    "document.querySelector('main').replaceWith(d.querySelector('main'))})}, "
    f"{REFRESH_S * 1000});")


_HEALTH_CLASS = {"healthy": "ok", "not": "muted"}  # "not probed (no shard running)"


def _stat(key: str, label: str, value: object) -> str:
    return (f"<div class='stat' data-key='{key}'><span class='v'>{html.escape(str(value))}"
            f"</span><span class='k'>{label}</span></div>")


def _chips(kind: str, title: str, names: list[str], extra: dict[str, str] | None = None) -> str:
    if not names:
        return ""
    chips = "".join(f"<span class='chip {kind}' data-shard='{html.escape(n)}'>{html.escape(n)}"
                    f"{(extra or {}).get(n, '')}</span>" for n in names)
    return f"<div class='part' data-part='{kind}'><h3>{title} ({len(names)})</h3>{chips}</div>"


def _location(run: dict[str, Any], loc: dict[str, Any]) -> str:
    from include.reporting.monitor import RATE_WINDOW_S
    where = ("run folder" if loc["location"] == "." else
             "forced regeneration " + loc["location"].split("/", 1)[-1])
    generating = [g["shard_id"] for g in loc["generating"]]
    idle = loc["idle_s"] is not None and loc["idle_s"] > RATE_WINDOW_S
    state = ("generating" if generating and not idle else "idle" if generating else
             "complete" if loc["shards_left"] == 0 and not loc["tokenizing"] else "waiting")
    bars = {g["shard_id"]: f" {g['finished']}/{g['prompts']}<span class='bar'><i style='width:"
            f"{100 * g['finished'] // max(g['prompts'], 1)}%'></i></span>"
            for g in loc["generating"]}
    r = loc["rows"]
    left = "-" if loc["shards_left"] is None else loc["shards_left"]
    rate = f"{loc['tokens_per_s']:,.1f}" + (" (idle)" if idle else "")
    servers = " ".join(
        f"<span class='{_HEALTH_CLASS.get(s['health'].split(' ')[0], 'bad')}'>&#9679; "
        f"{html.escape(s['url'])} {html.escape(s['health'])}</span>" for s in loc["servers"])
    reports = " ".join(
        f"<a href='{URL_PREFIX}/files/{html.escape(rep['key'])}' target='_blank'>"
        f"{html.escape(rep['airflow_run_id'])}</a> ({'passed' if rep['passed'] else 'FAILED'})"
        for rep in loc["reports"])
    return (
        f"<section class='run' data-run='{html.escape(run['run_name'])}' "
        f"data-location='{html.escape(loc['location'])}'><header>"
        f"<h2>{html.escape(run['run_name'])}</h2><span class='muted'>{html.escape(where)}</span>"
        f"<span class='badge {state}' data-key='state'>{state}</span></header>"
        "<div class='stats'>"
        + _stat("done", "shards done", f"{loc['shards_done']}/{run['shards_in_run']}")
        + _stat("generating", "generating", len(generating))
        + _stat("tokenizing", "tokenizing", len(loc["tokenizing"]))
        + _stat("left", "shards left", left) + _stat("completed", "completed", r["completed"])
        + _stat("skipped", "skipped", r["skipped"]) + _stat("failed", "failed", r["failed"])
        + _stat("tps", "tokens/s", rate) + _stat("eta", "ETA", _duration(loc["eta_s"]))
        + "</div>"
        + _chips("generating", "Generating", generating, bars)
        + _chips("tokenizing", "Generated, tokenizing", loc["tokenizing"])
        + _chips("left", "Left", loc["left"] or [])
        + _airflow_part(loc.get("airflow_runs", []))
        + (f"<div class='part'><h3>Servers</h3>{servers}</div>" if servers else "")
        + (f"<div class='part'><h3>Reports</h3>{reports}</div>" if reports else "")
        + "</section>")


def _shard_chip(kind: str, shard: dict[str, Any]) -> str:
    step = "" if kind == "done" else (
        f" <span class='muted'>{html.escape(shard['task'].split('.')[-1])} "
        f"{html.escape(shard['state'] or 'not scheduled')}</span>")
    return (f"<a class='chip {kind}' data-shard='{html.escape(shard['shard_id'])}' "
            f"href='{html.escape(shard['url'])}' target='_top' title='task log'>"
            f"{html.escape(shard['shard_id'])}{step}</a>")


def _airflow_run(run: dict[str, Any], with_name: bool = False) -> str:
    from include.reporting.airflow_runs import SHARD_CLASSES

    counts = run["shard_counts"]
    summary = ", ".join(f"{counts[c]} {c}" for c in SHARD_CLASSES if counts[c])
    rows = []
    for kind in SHARD_CLASSES:
        shards = run["shards"][kind]
        if not shards:
            continue
        chips = "".join(_shard_chip(kind, s) for s in shards)
        # Done shards are many and need no attention: folded away.
        rows.append(f"<details data-part='af-{kind}'><summary class='muted'>{kind} "
                    f"({len(shards)})</summary>{chips}</details>" if kind == "done" else
                    f"<div data-part='af-{kind}'>{chips}</div>")
    name = f"<b>{html.escape(run['run_name'])}</b> " if with_name else ""
    state = html.escape(str(run["state"]))
    return (f"<div class='afrun' data-run-id='{html.escape(run['run_id'])}'>{name}"
            f"<a class='badge af-{state}' data-key='af-state' href='{html.escape(run['url'])}' "
            f"target='_top'>{state}</a> <a data-key='af-run' href='{html.escape(run['url'])}' "
            f"target='_top'>{html.escape(run['run_id'])}</a> <span class='muted'>"
            f"{html.escape(summary or 'no shard tasks yet')}</span>{''.join(rows)}</div>")


def _airflow_part(runs: list[dict[str, Any]]) -> str:
    if not runs:
        return ""
    return ("<div class='part' data-part='airflow'><h3>Airflow runs (newest first; names "
            "link to task logs)</h3>" + "".join(_airflow_run(r) for r in runs) + "</div>")


def render_page(state: dict[str, Any]) -> str:
    """Return the monitor page for ``page_state()``."""
    from include.reporting.monitor import DAG_ID, RATE_WINDOW_S

    root = state["output_root"]
    body = "".join(_location(r, loc) for r in state["runs"] for loc in r["locations"]) or (
        "<p>No runs under this location yet.</p>")
    others = state["other_airflow_runs"]
    if state["airflow_error"]:
        body = (f"<p class='bad' data-key='airflow-error'>Airflow's run states could not be "
                f"read: {html.escape(state['airflow_error'])}</p>") + body
    elif others:
        body = ("<section class='run' data-run='' data-location=''><header><h2>Airflow runs "
                "with no outputs here yet</h2></header><div class='part'>"
                + "".join(_airflow_run(r, with_name=True) for r in others)
                + "</div></section>") + body
    dag_url = html.escape(_ui_base() + f"/dags/{DAG_ID}")
    return (
        "<!doctype html><html class='light'><head><meta charset='utf-8'>"
        f"<title>Drafter data runs</title><script>{_COLOUR_MODE_JS}</script>"
        f"<style>{_CSS}</style></head><body><h1>Drafter data runs</h1>"
        f"<p class='muted'>Output location <code>{html.escape(root)}</code>; DAG "
        f"<a href='{dag_url}' target='_top'>{DAG_ID}</a>. Tokens/s and ETA from the "
        f"journals' own timestamps over their last {RATE_WINDOW_S:.0f} s; refreshed every "
        f"{REFRESH_S} s.</p><main id='runs' data-read='{time.time():.0f}'>{body}</main>"
        f"<script>{_REFRESH_JS}</script></body></html>")


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
    from airflow.api_fastapi.core_api.security import requires_access_dag
    from fastapi import Depends

    from include.reporting.monitor import DAG_ID, REPORT_MEDIA_TYPES, is_report_file

    app = FastAPI(
        title="Drafter data run monitor", docs_url=None, redoc_url=None, openapi_url=None,
        # The permission of the DAG's own run pages: whoever may read its runs may watch them.
        dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN, DAG_ID))])
    app.add_exception_handler(HTTPException, _login_first)  # type: ignore[arg-type]

    @app.get("/", response_class=HTMLResponse)
    def page() -> str:
        return render_page(page_state())

    @app.get("/api/runs")
    def runs() -> JSONResponse:
        return JSONResponse(page_state())

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


__all__ = ["LazyApp", "RegenMonitorPlugin", "create_app", "page_state", "render_page"]
