"""Airflow plugin: a page listing drafter-data runs with their live progress and reports.

Mounted in the API server at ``/regen-monitor`` (``fastapi_apps``) and linked from the UI's
navigation (``external_views``, shown in an iframe under Browse). It reads the runs' own
manifests and journals under the deployment's ``output_root`` (``REGEN_OUTPUT_ROOT``) through
``include.storage``, read-only, with the deployment's ``s3_conn_id`` for an s3:// root. The
page has no state of its own and no second source of truth.

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
import time
from functools import cache
from typing import Any

from airflow.plugins_manager import AirflowPlugin
from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

URL_PREFIX = "/regen-monitor"
REFRESH_S = 10


def output_root() -> str:
    """Return the output location the page lists runs under (the deployment's output root)."""
    from include.settings import DeploymentSettings

    return DeploymentSettings.load().output_root


@cache
def _monitor() -> Any:
    from include.reporting.monitor import RunMonitor
    from include.settings import DeploymentSettings
    from include.storage import open_store

    deployment = DeploymentSettings.load()
    store = open_store(deployment.output_root, read_only=True,
                       s3_conn_id=deployment.s3_conn_id)
    return RunMonitor(store)


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
    ".ok{color:var(--ok)}.bad{color:var(--bad)}")
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
        + (f"<div class='part'><h3>Servers</h3>{servers}</div>" if servers else "")
        + (f"<div class='part'><h3>Reports</h3>{reports}</div>" if reports else "")
        + "</section>")


def render_page(runs: list[dict[str, Any]], root: str) -> str:
    """Return the monitor page for run states from ``RunMonitor.live_runs``."""
    from include.reporting.monitor import DAG_ID, RATE_WINDOW_S

    body = "".join(_location(r, loc) for r in runs for loc in r["locations"]) or (
        "<p>No runs under this location yet.</p>")
    return (
        "<!doctype html><html class='light'><head><meta charset='utf-8'>"
        f"<title>Drafter data runs</title><script>{_COLOUR_MODE_JS}</script>"
        f"<style>{_CSS}</style></head><body><h1>Drafter data runs</h1>"
        f"<p class='muted'>Output location <code>{html.escape(root)}</code>; DAG "
        f"<a href='/dags/{DAG_ID}' target='_top'>{DAG_ID}</a>. Tokens/s and ETA from the "
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
        return render_page(_monitor().live_runs(), output_root())

    @app.get("/api/runs")
    def runs() -> JSONResponse:
        return JSONResponse(_monitor().live_runs())

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


__all__ = ["LazyApp", "RegenMonitorPlugin", "create_app", "render_page"]
