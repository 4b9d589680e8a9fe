"""The monitor page's HTML, from the plugin's page state: pure, no Airflow and no I/O.

``plugins/regen_monitor.py`` gathers the state (the runs' files, Airflow's runs) and the
words Airflow's UI shows for each state; this module lays them out. Every state word on the
page is Airflow's (``words``); every other word about a run's files is
``include.monitor.states.FILE_WORDS``'s. Sections come in ``page_order``: live runs first,
then newest first; each section starts with its newest Airflow run's state and, when a task
failed, why.
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping
from typing import Any

from include.dag_names import DAG_ID
from include.monitor.runs import RATE_WINDOW_S
from include.monitor.states import (
    FILE_WORDS,
    NO_STATUS,
    RECENT_RUNS,
    FileFact,
    ShardPhase,
    page_order,
)
from include.outcomes import PromptStatus

URL_PREFIX = "/regen-monitor"
REFRESH_S = 10


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
           "up_for_retry": "oklch(0.681 0.162 75.834)",
           "scheduled": "oklch(0.553 0.013 58.071)", "deferred": "oklch(0.541 0.281 293.009)",
           "upstream_failed": "oklch(0.705 0.191 47.604)", "skipped": "oklch(0.714 0.203 305.504)",
           "no_status": "oklch(0.708 0 0)"}
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
    "background:var(--no_status);text-decoration:none}"
    + "".join(f".badge.st-{k},.chip.st-{k}{{border-left-color:var(--{k})}}"
              f".badge.st-{k}{{background:var(--{k})}}" for k in _STATES)
    + ".note{margin:0;padding:8px 16px;border-bottom:1px solid var(--border)}"
    ".failure{margin:0;padding:8px 16px;border-bottom:1px solid var(--border);"
    "color:var(--bad)}.failure .msg{white-space:pre-line}"
    ".failure pre{margin:4px 0 0;white-space:pre-wrap;font:12px/1.4 "
    "ui-monospace,monospace;color:var(--fg)}"
    ".stats{display:grid;grid-template-columns:repeat(auto-fill,minmax(116px,1fr));gap:8px;"
    "padding:12px 16px}.stat{background:var(--bg-muted);border-radius:6px;padding:6px 10px}"
    ".stat .v{display:block;font-size:18px;font-weight:600}"
    ".stat .k{color:var(--fg-muted);font-size:12px}"
    ".part{padding:0 16px 12px}.part h3{font-size:13px;margin:4px 0;color:var(--fg-muted)}"
    ".chip{display:inline-flex;gap:6px;align-items:center;border:1px solid var(--border);"
    "border-left:4px solid var(--queued);border-radius:4px;padding:1px 8px;margin:2px;"
    "font:12px ui-monospace,monospace}.chip.journal_writing{border-left-color:var(--running)}"
    ".chip.generated{border-left-color:var(--up_for_retry)}"
    ".bar{width:60px;height:6px;background:var(--bg-muted);border-radius:3px;overflow:hidden}"
    ".bar i{display:block;height:100%;background:var(--running)}"
    ".ok{color:var(--ok)}.bad{color:var(--bad)}"
    ".afrun{margin:2px 0 6px}.afrun>div{margin:2px 0}a.chip{color:inherit;text-decoration:none}"
    "summary{cursor:pointer}")
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


_HEALTH_CLASS = {FILE_WORDS[FileFact.HEALTHY]: "ok", "not": "muted"}  # "not probed (...)"
#: The file parts of a section without an Airflow run, in page order: (key, shards of loc).
_FILE_PARTS = (ShardPhase.JOURNAL_WRITING, ShardPhase.GENERATED, ShardPhase.NO_JOURNAL)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _stat(key: str, label: str, value: object) -> str:
    return (f"<div class='stat' data-key='{key}'><span class='v'>{_e(value)}</span>"
            f"<span class='k'>{_e(label)}</span></div>")


def _word(words: Mapping[str, str], state: str | None) -> str:
    """Return Airflow's UI word for a state (None: no status)."""
    key = state or NO_STATUS
    return words.get(key, key)


def sections(state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Return the page's sections in ``page_order``: one per run outputs location, and one
    per Airflow run with no outputs yet (``files`` None)."""
    out = [{"run_name": r["run_name"], "run": r, "files": loc,
            "airflow_runs": loc.get("airflow_runs", [])}
           for r in state["runs"] for loc in r["locations"]]
    out += [{"run_name": a["run_name"], "run": None, "files": None, "airflow_runs": [a]}
            for a in state["other_airflow_runs"]]
    return page_order(out)


def _failure(run: Mapping[str, Any]) -> str:
    f = run.get("failure")
    if not f:
        return ""
    where = f["task_id"] + (f" {f['shard_id']}" if f.get("shard_id") else "")
    lines = "\n".join(f["lines"])
    return (f"<div class='failure' data-key='failure'><b>{_e(where)}</b>: <span class='msg'>"
            f"{_e(f['message'] or 'see its log')}</span> <a href='{_e(f['url'])}' target='_top'>"
            f"task log</a>{f'<pre>{_e(lines)}</pre>' if lines else ''}</div>")


#: A finished location's tokens/s: the report's figure, by its definition and its name
#: (include/reporting/render.py's TOKENS_PER_S; runs.generation_average). Live, the page
#: shows the last RATE_WINDOW_S seconds instead, named so.
TOKENS_PER_S = "tokens/s while generating"


def _note(run: Mapping[str, Any]) -> str:
    """The run's note in Airflow (e.g. "nothing to do: ..."), where the run is shown."""
    note = run.get("note")
    return (f"<div class='note' data-key='note'>Note: <span class='msg'>{_e(note)}</span></div>"
            if note else "")


def _badge(run: Mapping[str, Any], words: Mapping[str, str]) -> str:
    state = run.get("state") or NO_STATUS
    return (f"<a class='badge st-{_e(state)}' data-key='state' href='{_e(run['url'])}' "
            f"target='_top'>{_e(_word(words, run.get('state')))}</a>")


def _shard_chip(shard: Mapping[str, Any], words: Mapping[str, str],
                files: Mapping[str, Any] | None) -> str:
    task = shard["task"].split(".")[-1]
    note = ""
    if files is not None and shard["task"] == "shard.generate" and shard["state"] == "running":
        g = {x["shard_id"]: x for x in files["generating"]}.get(shard["shard_id"])
        note = (f" {g['finished']}/{g['prompts']}<span class='bar'><i style='width:"
                f"{100 * g['finished'] // max(g['prompts'], 1)}%'></i></span>" if g
                else f" <span class='muted'>{_e(FILE_WORDS[ShardPhase.NO_JOURNAL])}</span>")
    step = "" if shard["state"] == "success" else (
        f" <span class='muted'>{_e(task)} {_e(_word(words, shard['state']))}</span>")
    return (f"<a class='chip st-{_e(shard['state'])}' data-shard='{_e(shard['shard_id'])}' "
            f"href='{_e(shard['url'])}' target='_top' title='task log'>"
            f"{_e(shard['shard_id'])}{step}{note}</a>")


def _shards(run: Mapping[str, Any], words: Mapping[str, str],
            files: Mapping[str, Any] | None) -> str:
    rows = []
    for state, shards in run["shards"].items():
        chips = "".join(_shard_chip(s, words, files) for s in shards)
        title = f"{_e(_word(words, state))} ({len(shards)})"
        # Succeeded shards are many and need no attention: folded away.
        rows.append(f"<details data-part='af-{_e(state)}'><summary class='muted'>{title}"
                    f"</summary>{chips}</details>" if state == "success" else
                    f"<div data-part='af-{_e(state)}'><span class='muted'>{title}</span> "
                    f"{chips}</div>")
    return "".join(rows)


def _counts(run: Mapping[str, Any], words: Mapping[str, str]) -> str:
    return " · ".join(f"{_word(words, s)} {n}" for s, n in run["shard_counts"].items())


def _airflow_run(run: Mapping[str, Any], words: Mapping[str, str]) -> str:
    """An earlier Airflow run of a section: one line (state, id, shard counts, why)."""
    failure = run.get("failure")
    why = (f" <span class='bad'>{_e(failure['task_id'])}: {_e(failure['message'])}</span>"
           if failure else "")
    return (f"<div class='afrun' data-run-id='{_e(run['run_id'])}'>{_badge(run, words)} "
            f"<a data-key='af-run' href='{_e(run['url'])}' target='_top'>{_e(run['run_id'])}"
            f"</a> <span class='muted'>{_e(_counts(run, words))}</span>{why}"
            + (f" <span class='muted' data-key='note'>{_e(run['note'])}</span>"
               if run.get("note") else "") + "</div>")


def _file_stats(files: Mapping[str, Any], shards_in_run: int) -> str:
    r, t = files["rows"], files["tokenized_rows"]
    basis = (f"tokens/s, last {RATE_WINDOW_S:.0f} s" if files["rate_basis"] == "window"
             else TOKENS_PER_S)
    idle = files["idle_s"] is not None and files["idle_s"] > RATE_WINDOW_S and files["generating"]
    rate = ("-" if files["tokens_per_s"] is None else f"{files['tokens_per_s']:,.1f}") + (
        f" (no completion for {_duration(files['idle_s'])})" if idle else "")
    done = f"{files['shards_done']}/{shards_in_run}" if files["location"] == "." else (
        files["shards_done"])
    return ("<div class='stats'>"
            + _stat("done", "shards " + FILE_WORDS[ShardPhase.TOKENIZED], done)
            + _stat("completed", FILE_WORDS[PromptStatus.COMPLETED], r["completed"])
            + _stat("truncated", FILE_WORDS[FileFact.TRUNCATED], r["truncated"])
            + _stat("skipped", FILE_WORDS[PromptStatus.SKIPPED], r["skipped"])
            + _stat("failed", FILE_WORDS[PromptStatus.FAILED], r["failed"])
            + _stat("written", FILE_WORDS[FileFact.ROWS_WRITTEN], t["written"])
            + _stat("quarantined", FILE_WORDS[FileFact.QUARANTINED], t["quarantined"])
            + _stat("dropped", FILE_WORDS[FileFact.DROPPED], t["dropped"])
            + _stat("tps", basis, rate) + _stat("eta", "ETA", _duration(files["eta_s"]))
            + "</div>")


def _file_parts(files: Mapping[str, Any]) -> str:
    """The shards by their files, for a section no recent Airflow run speaks for."""
    names = {ShardPhase.JOURNAL_WRITING: [g["shard_id"] for g in files["generating"]],
             ShardPhase.GENERATED: files["tokenizing"], ShardPhase.NO_JOURNAL: files["left"] or []}
    bars = {g["shard_id"]: f" {g['finished']}/{g['prompts']}<span class='bar'><i style='width:"
            f"{100 * g['finished'] // max(g['prompts'], 1)}%'></i></span>"
            for g in files["generating"]}
    out = ""
    for kind in _FILE_PARTS:
        if names[kind]:
            chips = "".join(f"<span class='chip {kind}' data-shard='{_e(n)}'>{_e(n)}"
                            f"{bars.get(n, '') if kind == 'journal_writing' else ''}</span>"
                            for n in names[kind])
            out += (f"<div class='part' data-part='{kind}'><h3>{_e(FILE_WORDS[kind])} "
                    f"({len(names[kind])})</h3>{chips}</div>")
    return out


def _servers_and_reports(files: Mapping[str, Any], url_prefix: str) -> str:
    servers = " ".join(
        f"<span class='{_HEALTH_CLASS.get(s['health'].split(' ')[0], 'bad')}'>&#9679; "
        f"{_e(s['url'])} {_e(s['health'])}</span>" for s in files["servers"])
    reports = " ".join(
        f"<a href='{url_prefix}/files/{_e(rep['key'])}' target='_blank'>"
        f"{_e(rep['airflow_run_id'])}</a> "
        f"({_e(FILE_WORDS[FileFact.GATES_PASSED if rep['passed'] else FileFact.GATES_FAILED])})"
        + (f" <a data-key='card' href='{url_prefix}/files/{_e(rep['card'])}' target='_blank'>"
           "dataset card</a>" if rep.get("card") else "")
        for rep in files["reports"])
    return ((f"<div class='part'><h3>Servers</h3>{servers}</div>" if servers else "")
            + (f"<div class='part'><h3>Reports</h3>{reports}</div>" if reports else ""))


def _section(section: Mapping[str, Any], words: Mapping[str, str], url_prefix: str) -> str:
    files, runs = section["files"], section["airflow_runs"]
    newest = runs[0] if runs else None
    if files is None:
        where, loc = "no outputs yet", ""
    else:
        loc = files["location"]
        where = ("run folder" if loc == "." else
                 "forced regeneration " + loc.split("/", 1)[-1])
    header = (f"<h2>{_e(section['run_name'])}</h2><span class='muted'>{_e(where)}</span>")
    if newest is not None:
        header += (f"{_badge(newest, words)}<a class='muted' data-key='af-run' "
                   f"href='{_e(newest['url'])}' target='_top'>{_e(newest['run_id'])}</a>")
    else:
        header += (f"<span class='muted' data-key='state'>no Airflow run among the last "
                   f"{RECENT_RUNS}</span>")
    body = (_note(newest) + _failure(newest)) if newest is not None else ""
    if files is not None:
        body += _file_stats(files, section["run"]["shards_in_run"])
    if newest is not None and (newest["shards"] or newest["live"]):
        shards = _shards(newest, words, files)
        counts = _counts(newest, words) or "no shard tasks"
        body += (f"<div class='part afrun' data-part='airflow' "
                 f"data-run-id='{_e(newest['run_id'])}'><h3>Shards in this Airflow run "
                 f"({_e(counts)})</h3>{shards}</div>")
    elif files is not None:
        body += _file_parts(files)
    if len(runs) > 1:
        body += ("<div class='part' data-part='earlier'><h3>Earlier Airflow runs here</h3>"
                 + "".join(_airflow_run(r, words) for r in runs[1:]) + "</div>")
    if files is not None:
        body += _servers_and_reports(files, url_prefix)
    return (f"<section class='run' data-run='{_e(section['run_name'])}' "
            f"data-location='{_e(loc)}'><header>{header}</header>{body}</section>")


def render_page(state: Mapping[str, Any], words: Mapping[str, str], ui_base: str = "",
                url_prefix: str = URL_PREFIX) -> str:
    """Return the monitor page for the plugin's ``page_state()``; ``words`` maps each
    Airflow state value to the word Airflow's UI shows for it
    (``include.monitor.states.ui_words``)."""
    body = "".join(_section(s, words, url_prefix) for s in sections(state)) or (
        "<p>No runs under this location yet.</p>")
    if state["airflow_error"]:
        body = (f"<p class='bad' data-key='airflow-error'>Airflow's run states could not be "
                f"read: {_e(state['airflow_error'])}</p>") + body
    dag_url = _e(ui_base + f"/dags/{DAG_ID}")
    return (
        "<!doctype html><html class='light'><head><meta charset='utf-8'>"
        f"<title>Drafter data runs</title><script>{_COLOUR_MODE_JS}</script>"
        f"<style>{_CSS}</style></head><body><h1>Drafter data runs</h1>"
        f"<p class='muted'>Output location <code>{_e(state['output_root'])}</code>; DAG "
        f"<a href='{dag_url}' target='_top'>{DAG_ID}</a>. States are Airflow's; live runs "
        f"first, then newest first. Tokens/s: over the journals' last {RATE_WINDOW_S:.0f} s "
        "while shards generate, else the average while they generated; refreshed every "
        f"{REFRESH_S} s.</p><main id='runs' data-read='{time.time():.0f}'>{body}</main>"
        f"<script>{_REFRESH_JS}</script></body></html>")
