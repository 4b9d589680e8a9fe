"""The DAG's task bodies take servers from XCom as identifiers and refuse one not deployed,
and write a shard's outputs only where the run's settings and run id put them.

XCom can be edited over the REST API (Op and Admin users): an edited list of servers must not
make a shard send its prompts and the API key anywhere, nor an edited launch report make the
gate, preflight or teardown act on a host or command of its choosing, nor an edited plan
entry's ``outputs_uri`` make a shard write its journal, lease or files anywhere else. The task
bodies are called as Airflow calls them, with the deployment in the environment (``REGEN_*``).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from include.pipeline.binding import outputs_uri
from include.servers.commands import server_specs
from include.servers.expectations import ModelExpectation
from include.servers.launch_report import Action, LaunchReport, ServerOutcome
from include.settings import RunSettings
from include.settings.errors import TaskRefused
from tests.fixtures.settings import deployment_env

ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "regenerate_drafter_data"
MISMATCH = "XCom did not match the deployment"
HOSTS = [{"host": "127.0.0.1", "ssh_conn_id": "ssh_gpu", "gpus": [0, 1],
          "command_prefix": "nice -n 0"}]
IDENTS = [{"host": "127.0.0.1", "port": 30000}, {"host": "127.0.0.1", "port": 30001}]


@pytest.fixture(scope="module")
def dag() -> Any:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags")).dags[DAG_ID]


@pytest.fixture
def deployed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> RunSettings:
    """Put a deployment in the environment, as a worker has it; return a run's settings."""
    env = deployment_env({"gpu_hosts": HOSTS, "output_root": str(tmp_path),
                          "server_log_dir": "/srv/sglang"})
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return RunSettings.from_mapping({})


def body(dag: Any, task_id: str) -> Any:
    return dag.task_dict[task_id].python_callable


def report(settings: RunSettings, action: Action = "mismatched") -> dict[str, Any]:
    """Return a launch report's XCom; ``mismatched`` servers: teardown has nothing to run."""
    return LaunchReport([ServerOutcome(s, action, False) for s in server_specs(settings)],
                        ModelExpectation.from_settings(settings), 60.0, f"{DAG_ID}/r",
                        settings.deployment.sglang_conn_id).to_dict()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Record the server URLs each generate call would send requests to (and send none)."""
    import include.generation.shard as shard
    import include.pipeline.generate as generate

    calls: list[list[str]] = []
    monkeypatch.setattr(shard, "generate_shard",
                        lambda settings, shard_id, urls, *a, **k: calls.append(urls) or {})
    monkeypatch.setattr(generate, "shard_stores", lambda settings, outputs, split: (None, None))
    return calls


@pytest.mark.parametrize("servers", [
    [*IDENTS, {"host": "attacker.example", "port": 80}],
    ["http://attacker.example:80"],
    [{"host": "127.0.0.1", "port": 30000, "url": "http://attacker.example:30000"}],
    "http://attacker.example:80",
])
def test_generate_refuses_an_edited_server_list_before_any_request(
    dag: Any, deployed: RunSettings, sent: list[list[str]], servers: Any
) -> None:
    with pytest.raises(TaskRefused, match=MISMATCH):
        body(dag, "shard.generate")(shard_id="shard-00000", servers=servers,
                                    outputs_uri=deployed.run_uri, wait_for=None, params={})
    assert sent == []


def test_generate_sends_to_the_deployments_own_urls(
    dag: Any, deployed: RunSettings, sent: list[list[str]]
) -> None:
    body(dag, "shard.generate")(shard_id="shard-00000", servers=IDENTS,
                                outputs_uri=deployed.run_uri, wait_for=None, params={})
    assert sent == [["http://127.0.0.1:30000", "http://127.0.0.1:30001"]]


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _shard_task(dag: Any, task_id: str, outputs: Any, run_id: str, params: dict) -> None:
    """Call a shard task body as Airflow does, with the plan entry's ``outputs_uri``."""
    kwargs: dict[str, Any] = {"shard_id": "shard-00000", "outputs_uri": outputs,
                              "params": params}
    if "run_id" in inspect.signature(body(dag, task_id)).parameters:  # not in older releases
        kwargs["run_id"] = run_id
    if task_id == "shard.generate":
        kwargs.update(servers=IDENTS, wait_for=None)
    if task_id == "shard.upload":
        kwargs["generated"] = {"shard_id": "shard-00000", "already_done": False,
                               "lease": {"generation": 1, "holder": "x"}}
    body(dag, task_id)(**kwargs)


@pytest.mark.parametrize("task_id", ["shard.generate", "shard.upload", "shard.tokenize"])
@pytest.mark.parametrize("where", ["outside", "other_run", "not_forced", "other_airflow_run",
                                   "not_a_string"])
def test_a_shard_task_refuses_an_edited_outputs_uri_before_writing_a_byte(
    dag: Any, deployed: RunSettings, tmp_path: Path, task_id: str, where: str
) -> None:
    """Before: the tasks opened the plan entry's ``outputs_uri`` as given (only protected
    prefixes checked) and wrote the journal settings, lease and segments there."""
    run_id = "manual__2026-12-02T05:00:00+00:00"
    forced = {"force_regenerate": True}
    outside = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    params, edited = {
        # A local folder outside the output root and every data root.
        "outside": ({}, str(outside)),
        "other_run": ({}, str(tmp_path / "someone_elses_run")),
        # Under force_regenerate the run writes a fresh folder, never its own location.
        "not_forced": (forced, deployed.run_uri),
        "other_airflow_run": (forced, outputs_uri(RunSettings.from_mapping(forced),
                                                  "manual__other")),
        "not_a_string": ({}, {"uri": deployed.run_uri}),
    }[where]
    expected = outputs_uri(RunSettings.from_mapping(params), run_id)
    try:
        _shard_task(dag, task_id, edited, run_id, params)
        refused: BaseException | None = None
    except BaseException as exc:  # noqa: BLE001 - judged below (a refusal is a SystemExit)
        refused = exc
    assert _files(outside) == [] and _files(tmp_path) == []  # not a byte, anywhere
    assert isinstance(refused, TaskRefused), refused
    message = str(refused)
    assert "outputs_uri" in message and expected in message and MISMATCH in message


def test_the_gate_preflight_and_teardown_refuse_an_edited_launch_report(
    dag: Any, deployed: RunSettings
) -> None:
    good = report(deployed, "reused")
    assert body(dag, "health_targets")(report=good, params={}) == IDENTS
    assert body(dag, "preflight")(report=good, plan=[], params={}) == IDENTS
    edited = report(deployed)
    edited["servers"][1]["server"]["command_prefix"] = "touch /tmp/pwned;"
    for task_id, kwargs in (("health_targets", {}), ("preflight", {"plan": []}),
                            ("stop_servers", {"run_id": "r"})):
        with pytest.raises(TaskRefused, match=MISMATCH):
            body(dag, task_id)(report=edited, params={}, **kwargs)
    # The unedited report tears down (nothing held by this run here: nothing to run).
    body(dag, "stop_servers")(report=report(deployed), params={}, run_id="r")


def test_only_the_identifier_of_a_server_is_mapped_into_its_gate(dag: Any) -> None:
    gate = dag.task_dict["wait_for_server"]
    assert set(gate.expand_input.value) == {"server"}
    for fact in ("expected", "timeout_s", "sglang_conn_id", "settings"):
        assert fact not in gate.partial_kwargs
