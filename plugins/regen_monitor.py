"""Airflow plugin: a page listing drafter-data runs with their live progress and reports.

Mounted in the API server at ``/regen-monitor`` (``fastapi_apps``) and linked from the UI's
navigation (``external_views``, shown in an iframe under Browse). It reads the runs' own
manifests and journals under the deployment's ``output_root`` (``REGEN_OUTPUT_ROOT``) through
``include.storage``, read-only, with the deployment's ``s3_conn_id`` for an s3:// root. The page has no state of its own and no second source of truth.
"""

from __future__ import annotations

import html
import time
from functools import cache
from typing import Any

from airflow.plugins_manager import AirflowPlugin
from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse, JSONResponse, Response

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


def _location_rows(run: dict[str, Any]) -> str:
    rows = []
    for loc in run["locations"]:
        r = loc["rows"]
        servers = "<br>".join(
            f"<span class='{'ok' if s['health'] == 'healthy' else 'warn'}'>"
            f"{html.escape(s['url'])}: {html.escape(s['health'])}</span>"
            for s in loc["servers"]) or "-"
        reports = "<br>".join(
            f"<a href='{URL_PREFIX}/files/{html.escape(rep['key'])}'>"
            f"{html.escape(rep['airflow_run_id'])}</a> "
            f"({'passed' if rep['passed'] else 'FAILED'})" for rep in loc["reports"]) or "-"
        left = "-" if loc["shards_left"] is None else str(loc["shards_left"])
        rows.append(
            f"<tr class='loc'><td>{html.escape(run['run_name'])}</td>"
            f"<td>{html.escape(loc['location'])}</td>"
            f"<td class='done'>{loc['shards_done']}</td>"
            f"<td class='running'>{loc['shards_running']}</td><td class='left'>{left}</td>"
            f"<td class='completed'>{r['completed']}</td><td>{r['skipped']}</td>"
            f"<td>{r['failed']}</td><td class='tps'>{loc['tokens_per_s']:.1f}</td>"
            f"<td>{_duration(loc['eta_s'])}</td><td>{servers}</td><td>{reports}</td></tr>")
    return "".join(rows)


def render_page(runs: list[dict[str, Any]], root: str) -> str:
    """Return the monitor page for run states from ``RunMonitor.runs``."""
    body = "".join(_location_rows(r) for r in runs) or (
        "<tr><td colspan='12'>no runs under this location yet</td></tr>")
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<meta http-equiv='refresh' content='{REFRESH_S}'><title>Drafter data runs</title>"
        "<style>body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;"
        "font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px}.ok{color:#080}"
        ".warn{color:#b00}</style></head><body>"
        f"<h2>Drafter data runs</h2><p>Output location <code>{html.escape(root)}</code>, "
        f"read {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC; refreshes every "
        f"{REFRESH_S} s. Tokens/s and ETA over the last two minutes of shards in progress."
        "</p><table id='runs'><tr><th>run</th><th>outputs</th><th>shards done</th>"
        "<th>running</th><th>left</th><th>completed</th><th>skipped</th><th>failed</th>"
        "<th>tokens/s</th><th>ETA</th><th>servers</th><th>reports</th></tr>"
        f"{body}</table></body></html>")


def create_app() -> FastAPI:
    """Return the monitor's FastAPI app (mounted by Airflow under ``URL_PREFIX``)."""
    app = FastAPI(title="Drafter data run monitor")

    @app.get("/", response_class=HTMLResponse)
    def page() -> str:
        return render_page(_monitor().runs(), output_root())

    @app.get("/api/runs")
    def runs() -> JSONResponse:
        return JSONResponse(_monitor().runs())

    @app.get("/files/{key:path}")
    def report_file(key: str) -> Response:
        # Only report folders are served: never prompts, journals or training data.
        parts = key.split("/")
        if "report" not in parts[1:-1] or ".." in parts:
            raise HTTPException(404, "only report files are served")
        store = _monitor().store
        if not store.exists(key):
            raise HTTPException(404, f"{key} does not exist")
        media = {"html": "text/html", "png": "image/png", "json": "application/json",
                 "md": "text/markdown"}.get(key.rsplit(".", 1)[-1], "application/octet-stream")
        return Response(store.read(key), media_type=media)

    return app


class RegenMonitorPlugin(AirflowPlugin):
    """Register the monitor app and its navigation entry."""

    name = "regen_monitor"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "Drafter data runs"}]
    external_views = [{"name": "Drafter data runs", "href": URL_PREFIX + "/",
                       "url_route": "regen-monitor", "destination": "nav",
                       "category": "browse"}]


__all__ = ["RegenMonitorPlugin", "create_app", "render_page"]
