"""Runs triggered as a user would: REST with a login, under a real scheduler (standalone).

Every doomed conf fails in ``check_settings`` seconds after the trigger, with a task log
naming the setting, the value and what is accepted; nothing is prepared, launched or written.
Conf values the form can check are refused by the REST call itself, before a run exists.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from pathlib import Path

import pytest

from tests.fixtures.airflow_server import AirflowServer, airflow_server
from tests.fixtures.settings import deployment_env

ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "regenerate_drafter_data"

pytestmark = pytest.mark.integration

SECTIONS = ("Sources", "Preparation", "Model and servers", "Sampling", "Generation", "Shards",
            "Output", "Tokenization", "Quality gates")
DOOMED = {
    "command-in-conf": (
        {"server_launch_command": "sh -c 'echo PWNED-$(id -un) >&2'"},
        ["`server_launch_command` is a deployment setting", "REGEN_SERVER_LAUNCH_COMMAND"]),
    "protection-off": (
        {"protected_prefixes": [], "output_uri": "s3://b/completions/x"},
        ["`protected_prefixes` is a deployment setting", "`output_uri` is a deployment setting",
         "REGEN_OUTPUT_ROOT"]),
    "host-choice": (
        {"gpu_hosts": [{"host": "10.9.9.9", "ssh_conn_id": "prod_gpu", "gpus": [0]}]},
        ["`gpu_hosts` is a deployment setting", "REGEN_GPU_HOSTS"]),
    "file-outside-data-roots": (
        {"sources": [{"name": "secrets", "path": "/etc/shadow"}]},
        ["`sources[0].path`: got '/etc/shadow'", "inside the deployment's data roots"]),
    "backwards-range": (
        {"shard_range": "5-2"}, ["`shard_range`: '5-2'", "runs backwards", "'2-5'"]),
    "misspelled": ({"shard_sise": 10}, ["unknown setting `shard_sise`",
                                        "did you mean `shard_size`"]),
    "model-not-allowed": ({"model_path": "someone/else"},
                          ["`model_path`: got 'someone/else'", "REGEN_ALLOWED_MODELS"]),
    # Issue 34, item 1: the deployment's refusal did hide the protected run_name.
    "two-at-once": ({"model_path": "someone/else", "run_name": "completions"},
                    ["2 settings refused", "`model_path`: got 'someone/else'",
                     "`run_name` ('completions')", "protected"]),
    "catalogue-typo": ({"sources": [{"name": "metamath"}]},
                       ["'metamath' is not in the deployment's source catalogue",
                        "did you mean `metamathqa`"]),
    "missing-file": (
        {"sources": [{"name": "mine", "path": str(ROOT / "include/sample_data/gone.jsonl")}]},
        ["`sources[0]` (mine)", "gone.jsonl", "does not exist"]),
    "unreadable-dedupe": (
        {"dedupe_against": [str(ROOT / "include/sample_data/none")]},
        ["`dedupe_against[0]`", "does not exist or holds no .jsonl/.json files"]),
    "wrong-layout": (
        {"sources": [{"name": "mine", "kind": "metamathqa",
                      "path": str(ROOT / "include/sample_data/codefeedback.jsonl")}]},
        ["`sources[0]` (mine)", "kind 'metamathqa' needs columns"]),
}


@pytest.fixture(scope="module")
def airflow(tmp_path_factory) -> AirflowServer:
    work = tmp_path_factory.mktemp("trigger-as-a-user")
    env = deployment_env({"output_root": str(work / "out"),
                          "server_log_dir": str(work / "server-logs"),
                          "data_roots": [str(ROOT / "include" / "sample_data")]})
    with airflow_server(work, users={"alice": "user", "root": "admin"}, command="standalone",
                        dags_folder=ROOT / "dags", env=env, timeout=240) as server:
        server.work = work  # type: ignore[attr-defined]
        admin = server.token("root")
        deadline = time.monotonic() + 120
        while server.request(f"/api/v2/dags/{DAG_ID}", token=admin).status != 200:
            assert time.monotonic() < deadline, "the DAG was never parsed"
            time.sleep(1)
        r = server.request(f"/api/v2/dags/{DAG_ID}", method="PATCH", token=admin,
                           body={"is_paused": False})
        assert r.status == 200, r.body
        yield server


def _trigger(server: AirflowServer, token: str, conf: dict):
    """POST a run; a transient SQLite error (standalone's database, busy with the runs just
    triggered) is retried as a REST client would, and if it persists the assertion shows the
    API server's own log lines for it."""
    for attempt in range(5):
        r = server.request(f"/api/v2/dags/{DAG_ID}/dagRuns", method="POST", token=token,
                           body={"logical_date": None, "conf": conf})
        if r.status != 500 or b"Database error" not in r.body:
            return r
        time.sleep(1 + attempt)
    error_id = re.search(rb"look for ID (\w+)", r.body)
    log = server.log.read_text(errors="replace")
    at = log.find(error_id.group(1).decode()) if error_id else -1
    raise AssertionError(f"POST dagRuns kept failing: {r.body[:300]!r}\n"
                         + (log[max(at - 3000, 0):at + 500] if at >= 0 else log[-3000:]))


def _wait_finished(server: AirflowServer, token: str, run_ids: list[str]) -> dict[str, str]:
    deadline = time.monotonic() + 500
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        for run_id in run_ids:
            q = urllib.parse.quote(run_id, safe="")
            states[run_id] = server.request(f"/api/v2/dags/{DAG_ID}/dagRuns/{q}",
                                            token=token).json()["state"]
        if all(s in ("success", "failed") for s in states.values()):
            return states
        time.sleep(2)
    raise AssertionError(f"runs still going after 500 s: {states}")


# Twelve runs, each a check_settings task on the standalone scheduler: beside CI's other
# pytest process they took longer than pytest-timeout's 300 s default (seen in CI).
@pytest.mark.timeout(600)
def test_doomed_confs_fail_in_check_settings_with_their_reason_in_the_task_log(
    airflow: AirflowServer
) -> None:
    token = airflow.token("alice")  # a user who may trigger runs, not an admin
    run_ids = {}
    for name, (conf, _) in DOOMED.items():
        r = _trigger(airflow, token, {"run_name": name.replace("-", "_"), **conf})
        assert r.status == 200, (name, r.status, r.body[:500])
        run_ids[name] = r.json()["dag_run_id"]
    states = _wait_finished(airflow, token, list(run_ids.values()))
    assert set(states.values()) == {"failed"}, states
    for name, (_, fragments) in DOOMED.items():
        q = urllib.parse.quote(run_ids[name], safe="")
        tis = airflow.request(f"/api/v2/dags/{DAG_ID}/dagRuns/{q}/taskInstances",
                              token=token).json()["task_instances"]
        by_task = {ti["task_id"]: ti["state"] for ti in tis}
        assert by_task["check_settings"] == "failed", (name, by_task)
        assert by_task["prepare_prompts"] == "upstream_failed", (name, by_task)
        assert by_task["launch_servers"] in (None, "upstream_failed"), (name, by_task)
        # Each log line as the UI gets it: the message and the exception's details.
        content = airflow.request(
            f"/api/v2/dags/{DAG_ID}/dagRuns/{q}/taskInstances/check_settings/logs/1",
            token=token, accept="application/json").json()["content"]
        log = "\n".join(json.dumps(line, ensure_ascii=False) for line in content)
        # A refusal is logged wrapped on short lines: read the messages back as one text.
        said = " ".join(" ".join(str(line.get("event", "")) for line in content).split())
        for fragment in fragments:
            assert fragment in said, (name, fragment, log[-2000:])
        assert "PWNED" not in log
        # Issue 34, item 3: the reason, and no traceback of Airflow's frames under it; the
        # last error line is the one-line reason, the policy's "no retry" after it.
        assert not [line for line in content if line.get("error_detail")], (name, log[-3000:])
        exited = [line for line in content if line.get("event") == "Task exited"]
        assert len(exited) == 1 and re.match(r"\d+ settings? refused: ",
                                             str(exited[0].get("exit_code"))), (name, log[-3000:])
        assert any(line.get("event") == "Retry policy decision" and line.get("action") == "fail"
                   for line in content), (name, log[-3000:])
    work: Path = airflow.work  # type: ignore[attr-defined]
    assert not (work / "out").exists() and not (work / "server-logs").exists()


@pytest.mark.parametrize(("conf", "param"), [({"max_tokens": 0}, "max_tokens"),
                                             ({"run_name": "x\n"}, "run_name"),
                                             ({"temperature": "hot"}, "temperature")])
def test_values_the_form_checks_are_refused_by_the_trigger_itself(
    airflow: AirflowServer, conf, param
) -> None:
    r = _trigger(airflow, airflow.token("alice"), conf)
    assert r.status == 400, (r.status, r.body[:300])
    assert param in r.body.decode()


def test_the_trigger_form_shows_run_settings_only(airflow: AirflowServer, tmp_path) -> None:
    from tests.integration.plugins.browser import Browser, chromium_path

    exe = chromium_path()
    if exe is None:
        pytest.skip("chromium is not installed (./dev setup installs it)")
    artifacts = ROOT / "var" / "test-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    with Browser(exe, tmp_path / "profile", width=1400, height=1000) as browser:
        browser.goto(airflow.base + f"/dags/{DAG_ID}",
                     until="document.querySelector('input[name=password]')")
        browser.type_into("input[name=username]", "alice")
        browser.type_into("input[name=password]", airflow.passwords["alice"])
        browser.click("button[type=submit]")
        browser.wait_for("[...document.querySelectorAll('button')].some("
                         "b => b.textContent.trim() === 'Trigger')")
        browser.evaluate("[...document.querySelectorAll('button')].find("
                         "b => b.textContent.trim() === 'Trigger').click()")
        browser.wait_for("document.body.innerText.includes('Quality gates')")
        # Open every section of the form, as a user would to see its fields.
        text = browser.text()
        # A section opens on a click and shows its fields.
        trigger = 'button[data-part="item-trigger"][id$="trigger:Sources"]'
        browser.press(trigger)
        browser.wait_for("document.body.innerText.includes('Dedupe against')")
        browser.screenshot(artifacts / "trigger_form.png", full_page=False)
    # The form is built from the DAG's params: exactly the run settings, and no deployment
    # setting (hosts, commands, credentials, protected locations).
    from include.settings import DeploymentSettings, RunSettings

    params = airflow.request(f"/api/v2/dags/{DAG_ID}/details",
                             token=airflow.token("alice")).json()["params"]
    assert set(params) == set(RunSettings.model_fields)
    assert not set(params) & set(DeploymentSettings.model_fields)
    for section in SECTIONS:
        assert section in text, section
    assert "Advanced Options" in text
