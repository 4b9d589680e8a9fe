"""The monitor plugin in a real Airflow API server with login, rendered in headless Chromium.

A small real run is left mid-way (shards done, one generating, one left, servers up) with a
report. One Airflow per auth manager serves it: the simple auth manager with real users (not
the all-admins shortcut) and FAB, as compose runs it. Without a session every route of the
plugin is refused; with a token or the UI's session cookie it answers; a user logging in
through the real login form lands on the page with the run's data (screenshots are kept under
``var/test-artifacts/``).

A second run, ``watched``, is the DAG itself run once under ``airflow dags test`` on the simple
manager's database (one shard, one stand-in server the DAG's launcher starts, slowed through
its fault file while it is watched): while it generates, Airflow's REST API and Airflow's own
page of the mapped shard tasks, in Chromium, name the running shard task by its shard, and the
page shows the run running with that shard; afterwards the page shows the run's state and its
shard with links that open the run and the shard's task in Airflow's UI, and no task logged an
error.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import pytest

from include.monitor.states import run_path
from include.reporting import QualityGates, build_report
from include.storage import LocalStore
from sglang_standin.process import shell_launch_command
from sglang_standin.switchboard import write_faults
from tests.fixtures.airflow_server import AirflowServer, airflow_server
from tests.fixtures.ports import free_port_block
from tests.fixtures.settings import deployment_env
from tests.integration.plugins.browser import Browser, BrowserError, chromium_path
from tests.integration.reporting.real_run import build_run, run_settings, start_servers

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "var" / "test-artifacts"
PAGE = "/regen-monitor/"
RUNS = "/regen-monitor/api/runs"
HTML = "text/html,application/xhtml+xml"
DAG_ID = "regenerate_drafter_data"


@pytest.fixture(scope="module")
def small_run(tmp_path_factory, tokenizer_dir) -> Iterator[dict[str, Any]]:
    """Build the run mid-way; yield its output root, report key, a journal key and the name of
    the shard left generating."""
    out = tmp_path_factory.mktemp("out")
    servers = start_servers(tokenizer_dir)
    try:
        settings = run_settings(out, tokenizer_dir)
        done, _ = build_run(settings, [p.url for p in servers], finish=2, generate_only=1)
        store = LocalStore(settings.run_uri)
        build_report(settings, store, store, done, [], run_id="manual__first_two",
                     gates=QualityGates(max_truncation_rate=1, max_failure_rate=1))
        journal = next(k for k in store.list("journal/") if k.endswith(".jsonl"))
        # journal/<shard>/... (and <shard>.compacted.json[l] beside a published shard's)
        generating = sorted({k.split("/")[1].split(".")[0] for k in store.list("journal/")}
                            - {k.split("/")[1].split(".")[0] for k in store.list("generated/")})
        assert len(generating) == 1
        yield {"root": str(out), "generating": generating[0],
               "report": f"{settings.run_name}/report/manual__first_two/report.html",
               "journal": f"{settings.run_name}/{journal}",
               "ports": [p.port for p in servers]}
    finally:
        for p in servers:
            p.stop()


def _own_servers(ports: list[int]) -> dict[str, str]:
    """Return the deployment settings listing the stand-ins as its servers: the monitor
    probes only the deployment's own (``gpu_hosts`` x ``port_base`` + GPU)."""
    base = min(*ports, 65000)
    return {"REGEN_GPU_HOSTS": json.dumps([{"host": "127.0.0.1",
                                             "gpus": [p - base for p in ports]}]),
            "REGEN_PORT_BASE": str(base)}


def _airflow(tmp_path_factory, small_run, auth_manager: str, users: dict[str, str]
             ) -> Iterator[AirflowServer]:
    env = {"REGEN_OUTPUT_ROOT": small_run["root"], **_own_servers(small_run["ports"])}
    with airflow_server(tmp_path_factory.mktemp(auth_manager), auth_manager=auth_manager,
                        users=users, env=env) as server:
        yield server


@pytest.fixture(scope="module")
def simple(tmp_path_factory, small_run) -> Iterator[AirflowServer]:
    """The simple auth manager with real users (the least role: viewer)."""
    yield from _airflow(tmp_path_factory, small_run, "simple", {"alice": "admin", "vera": "viewer"})


@pytest.fixture(scope="module")
def fab(tmp_path_factory, small_run) -> Iterator[AirflowServer]:
    """FAB, as compose runs it: a Viewer, and a Public user who may not read the DAG."""
    yield from _airflow(tmp_path_factory, small_run, "fab", {"bob": "Viewer", "pat": "Public"})


@pytest.fixture
def browser(tmp_path) -> Iterator[Browser]:
    path = chromium_path()
    if path is None:
        pytest.skip("chromium is not installed (./dev setup installs it)")
    with Browser(path, tmp_path / "chrome") as b:
        yield b


def _routes(small_run: dict[str, Any]) -> list[str]:
    return [PAGE, RUNS, f"/regen-monitor/files/{small_run['report']}"]


def _assert_refused_anonymously(server: AirflowServer, small_run: dict[str, Any]) -> None:
    for path in _routes(small_run):
        r = server.request(path)
        assert r.status == 401, (path, r.status, r.body[:200])
        assert b"small" not in r.body and b"Quality gates" not in r.body
    # A browser is sent to the auth manager's login page, which brings it back afterwards.
    r = server.request(PAGE, accept=HTML)
    assert r.status == 303, (r.status, r.body[:200])
    next_url = parse_qs(urlsplit(r.headers["location"]).query)["next"]
    assert next_url == [server.base + PAGE]


def test_without_a_session_the_monitor_and_its_routes_are_refused(simple, small_run) -> None:
    _assert_refused_anonymously(simple, small_run)
    assert simple.request(PAGE, accept=HTML).headers["location"].startswith("/auth/login?")
    # A token Airflow did not sign is refused as well, in the header or in the cookie.
    forged = simple.token("vera")[:-4] + "AAAA"
    assert simple.request(RUNS, token=forged).status == 403
    assert simple.request(RUNS, cookie=forged).status == 403
    # FastAPI's generated docs and schema are off, for everyone.
    token = simple.token("alice")
    for path in ("/regen-monitor/docs", "/regen-monitor/redoc", "/regen-monitor/openapi.json"):
        for auth in ({}, {"token": token}):
            r = simple.request(path, **auth)
            assert r.status == 404 and b"openapi" not in r.body.lower(), (path, auth, r.status)


def test_with_a_token_or_the_session_cookie_the_routes_work(simple, small_run) -> None:
    token = simple.token("vera")  # the least role: viewer
    r = simple.request(RUNS, token=token)
    assert r.status == 200
    loc = _run(r.json(), "small")["locations"][0]
    assert (loc["shards_done"], loc["shards_running"], loc["shards_left"]) == (2, 1, 1)
    assert [g["shard_id"] for g in loc["generating"]] == [small_run["generating"]]
    assert loc["servers"] and all(s["health"] == "healthy" for s in loc["servers"])
    assert loc["reports"][0]["key"] == small_run["report"]
    # The UI's session is the same token in the `_token` cookie.
    page = simple.request(PAGE, cookie=token)
    assert page.status == 200 and b"manual__first_two" in page.body

    # The report link serves the report, images included; nothing else of the run is served.
    report = simple.request(f"/regen-monitor/files/{small_run['report']}", token=token)
    assert report.status == 200 and b"Quality gates" in report.body
    png = small_run["report"].rsplit("/", 1)[0] + "/throughput.png"
    assert simple.request(f"/regen-monitor/files/{png}", token=token).body.startswith(b"\x89PNG")
    for key in ("small/prompts/manifest.json", small_run["journal"]):
        assert simple.request(f"/regen-monitor/files/{key}", token=token).status == 404, key

    # Airflow itself lists the plugin's app and navigation entry.
    plugins = simple.request("/api/v2/plugins", token=token).json()["plugins"]  # type: ignore[index]
    mine = next(p for p in plugins if p["name"] == "regen_monitor")
    assert mine["external_views"][0]["href"] == PAGE


def _run(state: Any, name: str) -> dict[str, Any]:
    """Return the run folder ``name`` of the monitor's ``/api/runs`` answer."""
    return next(r for r in state["runs"] if r["run_name"] == name)


def _assert_page_shows_the_run(browser: Browser, small_run: dict[str, Any],
                               frame: str = "document") -> None:
    def text(selector: str) -> str:
        found = browser.evaluate(f"{frame}.querySelector({json.dumps(selector)})?.textContent")
        return f"missing {selector}" if found is None else str(found)

    run = "[data-run=small][data-location='.']"
    assert text(f"{run} [data-key=done] .v") == "2/4"
    # No Airflow run wrote it: the page says so, and the shards by their files alone.
    assert text(f"{run} [data-key=state]") == "no Airflow run among the last 10"
    assert text(f"{run} [data-part=no_journal] h3") == "no journal yet (1)"
    generating = text(f"{run} [data-part=journal_writing] .chip")
    assert generating.startswith(small_run["generating"] + " ")
    assert "healthy" in text(f"{run} .ok") and "manual__first_two" in text(f"{run} a[href*=report]")


def _background(browser: Browser, frame: str = "document") -> str:
    return str(browser.evaluate(f"getComputedStyle({frame}.body).backgroundColor"))


def _log_in(browser: Browser, server: AirflowServer, user: str) -> None:
    """Open the page without a session and log in through the simple manager's form."""
    browser.goto(server.base + PAGE, until="document.querySelector('input[name=password]')")
    assert "/auth/login" in browser.url()
    browser.type_into("input[name=username]", user)
    browser.type_into("input[name=password]", server.passwords[user])
    browser.click("button[type=submit]")
    browser.wait_for("document.querySelector('main#runs section.run')")
    assert browser.url() == server.base + PAGE


def test_login_form_leads_to_the_page_with_the_run(simple, small_run, browser) -> None:
    _log_in(browser, simple, "vera")
    assert "_token" in browser.cookies()
    _assert_page_shows_the_run(browser, small_run)
    light = _background(browser)
    browser.screenshot(ARTIFACTS / "regen_monitor_page.png")
    # Standalone, the page follows the system's colour scheme.
    browser.dark_mode(True)
    browser.wait_for("document.documentElement.classList.contains('dark')")
    assert _background(browser) != light
    browser.screenshot(ARTIFACTS / "regen_monitor_page_dark.png")
    browser.dark_mode(False)

    # Inside Airflow's UI (Browse menu) the page is framed with the same session, in the
    # colour mode the user chose in Airflow, and follows it when the user switches.
    frame = "document.querySelector('iframe').contentDocument"
    browser.evaluate("localStorage.setItem('theme', 'dark')")
    browser.goto(simple.base + "/plugin/regen-monitor",
                 until=f"{frame}?.querySelector('main#runs section.run')")
    _assert_page_shows_the_run(browser, small_run, frame)
    browser.wait_for(f"{frame}.documentElement.classList.contains('dark')")
    browser.screenshot(ARTIFACTS / "regen_monitor_in_airflow_dark.png", full_page=False)
    browser.evaluate("document.documentElement.classList.replace('dark', 'light')")
    browser.wait_for(f"{frame}.documentElement.classList.contains('light')")
    assert _background(browser, frame) == light
    browser.evaluate("localStorage.setItem('theme', 'light')")
    browser.goto(simple.base + "/plugin/regen-monitor",
                 until=f"{frame}?.querySelector('main#runs section.run')")
    browser.screenshot(ARTIFACTS / "regen_monitor_in_airflow.png", full_page=False)


def test_fab_refuses_anonymous_and_public_users_and_serves_a_viewer(fab, small_run,
                                                                    browser) -> None:
    _assert_refused_anonymously(fab, small_run)
    # Authentication is not enough: a user whose role may not read the DAG's runs is refused.
    public = fab.token("pat")
    assert fab.request(RUNS, token=public).status == 403
    assert fab.request(PAGE, token=public, accept=HTML).status == 403
    viewer = fab.token("bob")
    assert fab.request(RUNS, token=viewer).status == 200
    assert fab.request(f"/regen-monitor/files/{small_run['report']}", token=viewer).status == 200

    # FAB's own (server-rendered) login form brings the user back to the page.
    browser.goto(fab.base + PAGE, until="document.querySelector('#password')")
    browser.type_into("#username", "bob")
    browser.type_into("#password", fab.passwords["bob"])
    browser.click("input[type=submit]")
    browser.wait_for("document.querySelector('main#runs section.run')")
    assert browser.url() == fab.base + PAGE
    _assert_page_shows_the_run(browser, small_run)
    browser.screenshot(ARTIFACTS / "regen_monitor_page_fab.png")


# --- Airflow's side: a real run of the DAG on the simple manager's database -------------------
#: Generation slow enough (a few seconds for the shard) to be watched while it runs.
WATCHED_SERVER_ARGS = ["--enable-metrics", "--standin-time-scale", "0.1",
                       "--standin-median-output-tokens", "150",
                       "--standin-warmup-seconds", "0.05", "--reasoning-parser", "qwen3"]
#: The stand-in's speed (its fault file's ``time_scale``) until the running shard has been
#: seen over REST, in Chromium and on the monitor: 10 times slower, so the shard generates for
#: 20 s or more, far longer than the browser needs to look; then the command line's speed
#: again. Not slower: the preflight request before the shard is slowed as well (6 s here).
WATCHED_HOLD_TIME_SCALE = 1.0


def _watched_conf(small_run: dict[str, Any], tokenizer_dir: Path, tmp: Path,
                  fault_file: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The watched run's trigger conf and deployment: one shard of the sample prompts, one
    server that follows ``fault_file``."""
    run = {
        "run_name": "watched", "shard_size": 100, "shard_range": "0",
        "model_path": str(tokenizer_dir), "served_model_name": "Qwen/Qwen3.6-27B",
        "context_length": 800, "max_tokens": 300, "min_completion_tokens": 64,
        "max_truncation_rate": 1.0, "progress_interval_s": 2, "launch_timeout_s": 60,
    }
    deployment = {
        "output_root": small_run["root"], "allowed_models": [str(tokenizer_dir)],
        "gpu_hosts": [{"host": "127.0.0.1", "gpus": [0]}], "port_base": free_port_block(1),
        "server_launch_command": shell_launch_command(module="sglang_standin.switchboard"),
        "server_log_dir": str(tmp / "servers"),
        "extra_server_args": [*WATCHED_SERVER_ARGS, "--standin-fault-file", str(fault_file)],
    }
    return run, deployment


def _airflow_runs(state: Any) -> list[dict[str, Any]]:
    """Every Airflow run in a ``/api/runs`` answer, in run sections or not."""
    return [*state["other_airflow_runs"], *(a for r in state["runs"] for loc in r["locations"]
                                            for a in loc["airflow_runs"])]


def _look_at_the_mapped_tasks(browser: Browser, server: AirflowServer, token: str,
                              ti: dict[str, Any]) -> dict[str, Any]:
    """Open Airflow's page of the run's mapped ``shard.generate`` instances, wait until its
    table names ``ti`` by its shard, then ask REST for the task's state at that moment.

    Return the page's path, the text of the table row naming the shard (None if the page
    never showed it, with the browser's error) and the state REST gave right after.
    """
    path = run_path(DAG_ID, ti["dag_run_id"]) + "/tasks/shard.generate/mapped"
    name = json.dumps(ti["rendered_map_index"])
    row = f"[...document.querySelectorAll('tbody tr')].find(r => r.innerText.includes({name}))"
    seen: dict[str, Any] = {"path": path, "row": None, "error": None}
    try:
        browser.goto(server.base + path, until=row)
        seen["row"] = browser.evaluate(f"{row}.innerText")
    except BrowserError as exc:
        seen["error"] = str(exc)
    rest = (f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(ti['dag_run_id'], safe='')}"
            f"/taskInstances/shard.generate/{ti['map_index']}")
    for _ in range(10):  # SQLite is shared with the run: a busy answer is asked again
        r = server.request(rest, token=token)
        if r.status == 200:
            break
        time.sleep(0.2)
    seen["state"] = r.json()["state"] if r.status == 200 else f"HTTP {r.status}"  # type: ignore[index]
    browser.screenshot(ARTIFACTS / "airflow_mapped_shards_running.png")
    return seen


@pytest.fixture(scope="module")
def watched_run(simple, small_run, tokenizer_dir, tmp_path_factory) -> dict[str, Any]:
    """Run the DAG once under ``airflow dags test`` on ``simple``'s database, its stand-in
    slowed through its fault file; while it runs, keep the first REST answer listing a
    running ``shard.generate`` with a name, what Airflow's page of the mapped shard tasks
    showed of it in Chromium and the first monitor answer showing a running shard. Return
    those (``grid``: None without Chromium), the run id and the run's output."""
    tmp = tmp_path_factory.mktemp("watched")
    fault_file = tmp / "faults.json"
    write_faults(fault_file, time_scale=WATCHED_HOLD_TIME_SCALE)
    run, deployment = _watched_conf(small_run, tokenizer_dir, tmp, fault_file)
    env = {**simple.env, **deployment_env(deployment),
           "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"), "REGEN_MAX_ACTIVE_SHARDS": "1"}
    out_path = tmp / "dags-test.log"
    token = simple.token("vera")
    seen: dict[str, Any] = {}
    grid: dict[str, Any] | None = None
    chromium = chromium_path()
    with out_path.open("w") as out, ExitStack() as stack:
        browser = None
        if chromium:
            # Signed in before the run starts, so the browser is ready when the shard is. The
            # session cookie comes from a REST login: the form is tested on its own above,
            # and typing into it while the run loads both cores once missed its 30 s.
            browser = stack.enter_context(Browser(chromium, tmp / "chrome"))
            browser.send("Network.setCookie", name="_token", value=token,
                         url=simple.base + "/")
            browser.goto(simple.base + PAGE, until="document.querySelector('main#runs')")
        proc = subprocess.Popen(
            [sys.executable, str(Path(sys.executable).parent / "airflow"), "dags", "test",
             DAG_ID, "-c", json.dumps(run)], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None and (len(seen) < 2 or (browser is not None and grid is None)):
                # SQLite is shared with the run: a busy answer is asked again.
                if "rest" not in seen:
                    r = simple.request(f"/api/v2/dags/{DAG_ID}/dagRuns/~/taskInstances"
                                       "?task_id=shard.generate&state=running", token=token)
                    tis = r.json()["task_instances"] if r.status == 200 else []  # type: ignore[index]
                    # The task is running a moment before its name is rendered: wait for it.
                    if any(ti["rendered_map_index"] != str(ti["map_index"]) for ti in tis):
                        seen["rest"] = tis
                if "rest" in seen and browser is not None and grid is None:
                    grid = _look_at_the_mapped_tasks(browser, simple, token, seen["rest"][0])
                if "monitor" not in seen:
                    r = simple.request(RUNS, token=token)
                    running = [a for a in _airflow_runs(r.json())
                               if a["shards"].get("running")] if r.status == 200 else []
                    if running:
                        seen["monitor"] = running
                time.sleep(0.2)
        finally:
            # Seen (or not): the shard may finish at the command line's speed.
            write_faults(fault_file)
        try:
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    output = out_path.read_text()
    assert proc.returncode == 0 and "state=success" in output, output[-4000:]
    runs = simple.request(f"/api/v2/dags/{DAG_ID}/dagRuns", token=token).json()
    (run_id,) = [r["dag_run_id"] for r in runs["dag_runs"]  # type: ignore[index]
                 if (r["conf"] or {}).get("run_name") == "watched"]
    return {"seen": seen, "grid": grid, "output": output, "run_id": run_id}


def test_while_a_shard_generates_airflow_names_it_and_the_page_shows_it_running(
        watched_run) -> None:
    seen = watched_run["seen"]
    assert set(seen) == {"rest", "monitor"}, (
        f"the run ended before a running shard was seen: {sorted(seen)}; "
        + watched_run["output"][-2000:])
    # The grid's name for a running shard task is its shard, not its map index.
    (ti,) = seen["rest"]
    assert (ti["task_id"], ti["map_index"], ti["state"]) == ("shard.generate", 0, "running")
    assert ti["rendered_map_index"] == "shard-00000"
    (run,) = seen["monitor"]
    assert (run["run_id"], run["run_name"], run["state"]) == (
        watched_run["run_id"], "watched", "running")
    (shard,) = run["shards"]["running"]
    assert (shard["shard_id"], shard["task"]) == ("shard-00000", "shard.generate")


def test_airflow_s_page_of_the_mapped_shard_tasks_names_a_running_shard(watched_run) -> None:
    grid = watched_run["grid"]
    if grid is None:
        pytest.skip("chromium is not installed (./dev setup installs it)")
    assert grid["path"].startswith(f"/dags/{DAG_ID}/runs/")
    # Chromium showed the row of the shard's task by its name, running, and REST, asked
    # right after, said the task was still running (so it was when the page showed it).
    assert grid["row"] is not None, grid["error"]
    assert {"shard-00000", "Running"} <= set(grid["row"].split()), grid["row"]
    assert grid["state"] == "running", grid


def test_a_successful_run_logs_no_error(watched_run) -> None:
    # What a person reads in the task logs: no ERROR line (the PyTorch advisory was one).
    errors = [line for line in watched_run["output"].splitlines()
              if re.search(r"\bERROR\b|\[error\s*\]", line)]
    assert errors == []
    assert "[DAG TEST] end task task_id=report" in watched_run["output"]


def test_the_page_shows_airflow_s_run_with_links_to_the_run_and_shard_logs(
        simple, watched_run, browser) -> None:
    run_id = watched_run["run_id"]
    state = simple.request(RUNS, token=simple.token("vera")).json()
    (loc,) = _run(state, "watched")["locations"]
    assert [a["run_id"] for a in loc["airflow_runs"]] == [run_id]
    assert state["airflow_error"] is None

    _log_in(browser, simple, "vera")
    section = "[data-run=watched][data-location='.']"
    browser.wait_for(f"document.querySelector({json.dumps(section)})")

    def read(selector: str, js: str) -> str:
        """Return ``element.<js>`` of the element at ``selector`` in the run's row."""
        return str(browser.evaluate(
            f"document.querySelector({json.dumps(section + ' ' + selector)})?.{js}"))

    # The run's state first, in Airflow's word for it; its shards by Airflow's states.
    assert read("header [data-key=state]", "textContent") == "Success"
    assert read("[data-part=airflow]", "dataset.runId") == run_id
    assert browser.evaluate(
        f"[...document.querySelectorAll({json.dumps(section + ' [data-part=af-success] .chip')})]"
        ".map(e => e.dataset.shard)") == ["shard-00000"]
    browser.screenshot(ARTIFACTS / "regen_monitor_airflow_run.png")
    run_link = read("header [data-key=af-run]", "getAttribute('href')")
    log_link = read("[data-shard=shard-00000]", "getAttribute('href')")
    assert log_link == run_link + "/tasks/shard.generate/mapped/0"

    # The links open Airflow's own pages of the run and of the shard's task.
    browser.goto(simple.base + run_link,
                 until=f"document.body.innerText.includes({json.dumps(run_id)})")
    browser.goto(simple.base + log_link,
                 until="document.body.innerText.includes('shard-00000')")
    text = browser.text()
    assert "generate" in text and "Page not found" not in text, text[:1000]
    browser.screenshot(ARTIFACTS / "regen_monitor_shard_task.png")
