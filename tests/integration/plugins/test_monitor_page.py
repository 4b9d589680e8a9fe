"""The monitor plugin under a real ``airflow standalone``, rendered in headless Chromium.

A small real run is left mid-way (shards done, one generating, one left, servers up), the API
server loads ``plugins/`` and serves the page; Chromium renders it and the screenshot is kept
under ``var/test-artifacts/``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from include.reporting import QualityGates, build_report
from include.storage import LocalStore
from tests.fixtures.ports import free_port_block
from tests.integration.reporting.real_run import build_run, run_settings, start_servers

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "var" / "test-artifacts"
#: Restore SIGINT (ignored in children of a backgrounded shell) so kill -INT stops it cleanly.
WRAPPER = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
           "os.execv(sys.argv[1], sys.argv[1:])")


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        subprocess.run(["apt-get", "install", "-y", "chromium"], capture_output=True,
                       timeout=300)
        path = shutil.which("chromium")
    if path is None:
        pytest.skip("chromium is not installed and `apt-get install -y chromium` failed")
    return path


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


@pytest.fixture
def standalone(tmp_path):
    """Start ``airflow standalone`` with the repo's plugins; yield (base URL, env); stop it."""
    port = free_port_block(1)
    dags = tmp_path / "dags"
    dags.mkdir()  # no DAG to parse: the page does not need one, and startup stays short
    env = dict(os.environ, AIRFLOW_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT),
               AIRFLOW__CORE__DAGS_FOLDER=str(dags),
               AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"),
               AIRFLOW__CORE__LOAD_EXAMPLES="False", AIRFLOW__CORE__PARALLELISM="4",
               AIRFLOW__API__HOST="127.0.0.1", AIRFLOW__API__PORT=str(port),
               AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{port}",
               REGEN_OUTPUT_ROOT=str(tmp_path / "out"),
               # standalone starts its components as `airflow ...` found on PATH.
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    env.pop("AIRFLOW__CORE__UNIT_TEST_MODE", None)
    airflow = str(Path(sys.executable).parent / "airflow")
    log = open(tmp_path / "standalone.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-c", WRAPPER, airflow, "standalone"], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 75
        while True:
            try:
                if _get(base + "/api/v2/monitor/health")[0] == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail("airflow standalone did not come up:\n"
                            + (tmp_path / "standalone.log").read_text()[-3000:])
            time.sleep(0.5)
        yield base, env
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # our own session: only what we started
            proc.wait(timeout=10)
        log.close()


def test_monitor_page_shows_a_real_run_mid_way(standalone, tmp_path, tokenizer_dir) -> None:  # noqa: F811
    base, env = standalone
    servers = start_servers(tokenizer_dir)
    try:
        settings = run_settings(tmp_path / "out", tokenizer_dir)
        done, _ = build_run(settings, [p.url for p in servers], finish=2, generate_only=1)
        store = LocalStore(settings.run_uri)
        build_report(settings, store, store, done, [], run_id="manual__first_two",
                     gates=QualityGates(max_truncation_rate=1, max_failure_rate=1))
        status, body = _get(base + "/regen-monitor/api/runs", timeout=10)
        (run,) = json.loads(body)
        loc = run["locations"][0]
        assert (loc["shards_done"], loc["shards_running"], loc["shards_left"]) == (2, 1, 1)
        assert all(s["health"] == "healthy" for s in loc["servers"]) and loc["servers"]

        browser = _chromium()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "regen_monitor_page.png"
        shot.unlink(missing_ok=True)
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'chrome'}", "--window-size=1280,900"]
        url = base + "/regen-monitor/"
        subprocess.run([browser, *flags, f"--screenshot={shot}", url], capture_output=True,
                       timeout=60)
        assert shot.exists() and shot.stat().st_size > 5000
        dom = subprocess.run([browser, *flags, "--dump-dom", url], capture_output=True,
                             text=True, timeout=60).stdout
        assert "<td>small</td>" in dom
        assert "<td class=\"done\">2</td>" in dom and "<td class=\"left\">1</td>" in dom
        assert f"<td class=\"completed\">{sum(loc['rows'].values()) - loc['rows']['skipped'] - loc['rows']['failed']}</td>" in dom  # noqa: E501
        assert "healthy" in dom and "manual__first_two" in dom

        # The report link serves the report through the plugin, images included.
        rep = loc["reports"][0]["key"]
        status, html_page = _get(f"{base}/regen-monitor/files/{rep}", timeout=10)
        assert status == 200 and b"Quality gates" in html_page
        png = rep.rsplit("/", 1)[0] + "/throughput.png"
        assert _get(f"{base}/regen-monitor/files/{png}", timeout=10)[1].startswith(b"\x89PNG")
        with pytest.raises(urllib.error.HTTPError):
            _get(f"{base}/regen-monitor/files/small/prompts/manifest.json")

        # Airflow itself lists the plugin's app and navigation entry.
        password = json.loads((Path(env["AIRFLOW_HOME"])
                               / "simple_auth_manager_passwords.json.generated").read_text())
        req = urllib.request.Request(base + "/auth/token", method="POST",
                                     data=json.dumps({"username": "admin",
                                                      "password": password["admin"]}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            token = json.loads(r.read())["access_token"]
        req = urllib.request.Request(base + "/api/v2/plugins",
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            plugins = json.loads(r.read())["plugins"]
        mine = next(p for p in plugins if p["name"] == "regen_monitor")
        assert mine["external_views"][0]["href"] == "/regen-monitor/"
    finally:
        for p in servers:
            p.stop()
