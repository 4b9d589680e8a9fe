"""The DAG's task bodies take servers from XCom as identifiers and refuse one not deployed.

XCom can be edited over the REST API (Op and Admin users): an edited list of servers must not
make a shard send its prompts and the API key anywhere, nor an edited launch report make the
gate, preflight or teardown act on a host or command of its choosing. The task bodies are
called as Airflow calls them, with the deployment in the environment (``REGEN_*``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from include.servers.checks import ModelExpectation
from include.servers.commands import server_specs
from include.servers.report import Action, LaunchReport, ServerOutcome
from include.settings import RunSettings
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
    monkeypatch.setattr(generate, "open_run_store", lambda settings, uri=None: None)
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
    with pytest.raises(AirflowFailException, match=MISMATCH):
        body(dag, "shard.generate")(shard_id="shard-00000", servers=servers,
                                    outputs_uri="unused", wait_for=None, params={})
    assert sent == []


def test_generate_sends_to_the_deployments_own_urls(
    dag: Any, deployed: RunSettings, sent: list[list[str]]
) -> None:
    body(dag, "shard.generate")(shard_id="shard-00000", servers=IDENTS, outputs_uri="unused",
                                wait_for=None, params={})
    assert sent == [["http://127.0.0.1:30000", "http://127.0.0.1:30001"]]


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
        with pytest.raises(AirflowFailException, match=MISMATCH):
            body(dag, task_id)(report=edited, params={}, **kwargs)
    # The unedited report tears down (nothing held by this run here: nothing to run).
    body(dag, "stop_servers")(report=report(deployed), params={}, run_id="r")


def test_only_the_identifier_of_a_server_is_mapped_into_its_gate(dag: Any) -> None:
    gate = dag.task_dict["wait_for_server"]
    assert set(gate.expand_input.value) == {"server"}
    for fact in ("expected", "timeout_s", "sglang_conn_id", "settings"):
        assert fact not in gate.partial_kwargs
