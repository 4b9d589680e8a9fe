"""The monitor plugin in a real Airflow API server with login, rendered in headless Chromium.

A small real run is left mid-way (shards done, one generating, one left, servers up) with a
report. One Airflow per auth manager serves it: the simple auth manager with real users (not
the all-admins shortcut) and FAB, as compose runs it. Without a session every route of the
plugin is refused; with a token or the UI's session cookie it answers; a user logging in
through the real login form lands on the page with the run's data (screenshots are kept under
``var/test-artifacts/``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from include.reporting import QualityGates, build_report
from include.storage import LocalStore
from tests.fixtures.airflow_server import AirflowServer, airflow_server
from tests.integration.plugins.browser import Browser, chromium_path
from tests.integration.reporting.real_run import build_run, run_settings, start_servers

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "var" / "test-artifacts"
PAGE = "/regen-monitor/"
RUNS = "/regen-monitor/api/runs"
HTML = "text/html,application/xhtml+xml"


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
        generating = sorted({k.split("/")[1] for k in store.list("journal/")}
                            - {k.split("/")[1].split(".")[0] for k in store.list("generated/")})
        assert len(generating) == 1
        yield {"root": str(out), "generating": generating[0],
               "report": f"{settings.run_name}/report/manual__first_two/report.html",
               "journal": f"{settings.run_name}/{journal}"}
    finally:
        for p in servers:
            p.stop()


def _airflow(tmp_path_factory, small_run, auth_manager: str, users: dict[str, str]
             ) -> Iterator[AirflowServer]:
    with airflow_server(tmp_path_factory.mktemp(auth_manager), auth_manager=auth_manager,
                        users=users, env={"REGEN_OUTPUT_ROOT": small_run["root"]}) as server:
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
    (run,) = r.json()  # type: ignore[misc]
    loc = run["locations"][0]
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


def _assert_page_shows_the_run(browser: Browser, small_run: dict[str, Any],
                               frame: str = "document") -> None:
    def text(selector: str) -> str:
        found = browser.evaluate(f"{frame}.querySelector({json.dumps(selector)})?.textContent")
        return f"missing {selector}" if found is None else str(found)

    run = "[data-run=small][data-location='.']"
    assert text(f"{run} [data-key=done] .v") == "2/4"
    assert text(f"{run} [data-key=left] .v") == "1"
    assert text(f"{run} [data-key=state]") == "generating"
    generating = text(f"{run} [data-part=generating] .chip")
    assert generating.startswith(small_run["generating"] + " ")
    assert "healthy" in text(f"{run} .ok") and "manual__first_two" in text(f"{run} a[href*=report]")


def _background(browser: Browser, frame: str = "document") -> str:
    return str(browser.evaluate(f"getComputedStyle({frame}.body).backgroundColor"))


def test_login_form_leads_to_the_page_with_the_run(simple, small_run, browser) -> None:
    browser.goto(simple.base + PAGE, until="document.querySelector('input[name=password]')")
    assert "/auth/login" in browser.url()
    browser.type_into("input[name=username]", "vera")
    browser.type_into("input[name=password]", simple.passwords["vera"])
    browser.click("button[type=submit]")
    browser.wait_for("document.querySelector('main#runs section.run')")
    assert browser.url() == simple.base + PAGE
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
