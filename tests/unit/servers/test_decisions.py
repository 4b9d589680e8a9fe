"""The launcher's decisions, driven with plain data: probes, pid files, release lines.

A launch's commands are driven by ``drive``, which plays the launcher's part with canned
results: each test reads as the commands one server's launch runs and its outcome.
"""

from __future__ import annotations

from typing import Any

import pytest

from include.servers.commands import ServerSpec
from include.servers.decisions import (
    Command,
    ServerLaunch,
    launch_step,
    loading_outcome,
    next_command,
    plan_server,
    refused_outcome,
    replace_blocked,
    reused_outcome,
    run_holds,
    started_outcome,
    stop_verdict,
    stopped_meanwhile,
)
from include.servers.expectations import ModelExpectation
from include.servers.launch_report import LaunchReport, ServerOutcome
from include.servers.observations import ModelsProbe, Observation, ServerProcess
from tests.fixtures.settings import run_settings

EXPECTED = ModelExpectation("qwen", 32768)
SPEC = ServerSpec("gpu-a", 1, 30001, "ssh_gpu", "/tmp/sglang-regen", None)


def models(name: str = "qwen", length: int = 32768) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": name, "object": "model", "max_model_len": length}]}


def answering(body: Any = None, status: int = 200, error: str = "") -> ModelsProbe:
    return ModelsProbe(True, status, models() if body is None else body, error)


SILENT = ModelsProbe(False, error="connection refused")
ALIVE = ServerProcess(pid=4242, alive=True, owner="dag/run 1", leases=1)
DEAD = ServerProcess(pid=None, alive=False, owner="")


def step(probe: ModelsProbe, alive: bool, **kw: Any) -> tuple[str, list[str]]:
    kw.setdefault("replace_mismatched", False)
    return launch_step(probe, alive, EXPECTED, **kw)


# --- launching ----------------------------------------------------------------------------
def test_a_closed_port_gets_a_server_unless_a_live_process_is_loading_its_model() -> None:
    assert step(SILENT, alive=False) == ("start", [])
    # SGLang binds its port only once the model is loaded: a live process is loading, and
    # another would only fail to bind. Not a failure, whatever replacing allows.
    assert step(SILENT, alive=True) == ("loading", [])
    assert step(SILENT, alive=True, replace_mismatched=True) == ("loading", [])


def test_a_server_answering_with_the_runs_settings_is_reused_whatever_its_pid_file_says() -> None:
    assert step(answering(), alive=False) == ("reuse", [])
    assert step(answering(), alive=True, replace_mismatched=True) == ("reuse", [])


def test_a_mismatched_server_is_left_running_unless_replacing_is_allowed() -> None:
    action, differences = step(answering(models(length=4096)), alive=True)
    assert action == "refuse" and len(differences) == 1 and "4096" in differences[0]
    action, again = step(answering(models(length=4096)), alive=True, replace_mismatched=True)
    assert action == "replace" and again == differences


def test_a_401_names_the_connection_holding_the_key_and_other_statuses_their_error() -> None:
    action, differences = step(answering(status=401), alive=True, sglang_conn_id="sglang_prod")
    assert action == "refuse"
    assert "'sglang_prod'" in differences[0] and "REGEN_SGLANG_CONN_ID" in differences[0]
    _, differences = step(answering(status=500, error="boom"), alive=True)
    assert differences == ["/v1/models answered 500: boom"]


def test_the_pid_lease_and_owner_line_is_parsed_with_an_owner_holding_spaces() -> None:
    process = ServerProcess.parse("noise\npid=77 alive=1 leases=2 owner=dag/run: 1 b\n")
    assert process == ServerProcess(77, True, "dag/run: 1 b", 2)
    assert process.owned_by("dag/run: 1 b") and not process.owned_by("dag/run: 2")
    assert not ServerProcess(1, True, "").owned_by(None)
    assert ServerProcess.parse("pid= alive=0 leases=x owner=") == ServerProcess(None, False, "", 0)


def test_a_loading_server_serves_the_run_under_its_lease_and_is_no_problem() -> None:
    theirs = loading_outcome(SPEC, "dag/run 2", False, ALIVE, ServerProcess(4242, True, "x", 2))
    assert (theirs.action, theirs.pid, theirs.leased, theirs.started_by_this_run) == (
        "loading", 4242, True, False)
    assert SPEC.paths.pid_file in theirs.detail and "health gate waits" in theirs.detail
    assert "started by dag/run 1" in theirs.detail and theirs.detail.endswith("leases now: 2")
    # A retried launch of the run that started it keeps owning it: teardown stops it.
    ours = loading_outcome(SPEC, "dag/run 1", True, ALIVE, ALIVE)
    assert ours.started_by_this_run and ours.leased and run_holds(ours)
    assert "started earlier by this run (dag/run 1)" in ours.detail
    assert not loading_outcome(SPEC, None, False, ALIVE).leased
    report = LaunchReport([theirs], EXPECTED, 1800.0, "dag/run 2")
    assert report.urls == [SPEC.url] and report.problems == []
    assert report.health_targets() == [{"host": "gpu-a", "port": SPEC.port}]
    deployment = run_settings(gpu_hosts=[{"host": "gpu-a", "ssh_conn_id": "ssh_gpu",
                                          "gpus": [1]}])
    assert LaunchReport.from_dict(report.to_dict(), deployment).servers == report.servers
    # Its teardown releases the lease: the last one stops it, as for a reused server.
    assert stop_verdict(theirs) is Command.RELEASE
    kept = stop_verdict(theirs, {"outcome": "kept", "leases": "1", "holders": "dag/run 1"})
    assert kept[0] == "kept"


def test_a_refused_mismatch_says_how_to_replace_it() -> None:
    out = refused_outcome(SPEC, ALIVE, ["max_model_len 4096"])
    assert (out.action, out.started_by_this_run, out.leased) == ("mismatched", False, False)
    assert "replace_mismatched_servers" in out.detail and out.differences == ["max_model_len 4096"]


@pytest.mark.parametrize(
    ("release", "port_answers", "action", "words"),
    [
        ({"outcome": "kept", "leases": "2", "holders": "a b"}, False, "mismatched",
         "2 other run(s) lease it (a b)"),
        ({"outcome": "not-running", "pid": ""}, True, "failed", "launched by hand or elsewhere"),
        ({"outcome": "still-alive", "pid": "9"}, False, "failed", "process 9 survived SIGTERM"),
    ],
)  # fmt: skip
def test_a_replacement_is_blocked_by_other_leases_foreign_or_immortal_processes(
    release: dict[str, str], port_answers: bool, action: str, words: str
) -> None:
    out = replace_blocked(SPEC, ALIVE, release, ["d"], port_answers=port_answers)
    assert out is not None and out.action == action and words in out.detail
    assert out.differences == ["d"] and not out.started_by_this_run


def test_a_released_server_is_replaced_once_its_port_is_free() -> None:
    assert replace_blocked(SPEC, ALIVE, {"outcome": "stopped", "pid": "9"}, ["d"]) is None
    assert replace_blocked(SPEC, ALIVE, {"outcome": "not-running"}, ["d"]) is None


def test_a_reuse_records_the_lease_and_whether_this_run_started_it() -> None:
    unleased = reused_outcome(SPEC, None, False, ALIVE)
    assert (unleased.action, unleased.pid, unleased.leased) == ("reused", 4242, False)
    assert "started earlier" not in unleased.detail
    leased = reused_outcome(SPEC, "dag/run 1", True, ALIVE, ServerProcess(4243, True, "x", 3))
    assert (leased.pid, leased.leased, leased.started_by_this_run) == (4243, True, True)
    assert "started earlier by this run (dag/run 1)" in leased.detail
    assert leased.detail.endswith("leases now: 3")


def test_a_server_stopped_between_probe_and_lease_is_noticed() -> None:
    gone = ServerProcess(None, False, "", 1)
    assert stopped_meanwhile(ALIVE, gone)
    assert not stopped_meanwhile(ALIVE, ALIVE)
    # Reused without a pid file of ours (launched by hand): nothing to notice.
    assert not stopped_meanwhile(DEAD, gone)


def test_a_launch_without_a_pid_still_counts_as_started_so_teardown_tries() -> None:
    ok = started_outcome(SPEC, "replaced", "dag/run 1", "321")
    assert (ok.action, ok.pid, ok.started_by_this_run, ok.leased) == ("replaced", 321, True, True)
    bad = started_outcome(SPEC, "started", None, "", "Traceback ...")
    assert (bad.action, bad.pid, bad.started_by_this_run, bad.leased) == (
        "failed", None, True, False)
    assert bad.detail.endswith("log tail:\nTraceback ...")


# --- a launch, command by command ---------------------------------------------------------
#: Another run than the one that started ALIVE's process.
OWNER = "dag/run 2"
SHORT = models(length=4096)


def plan(probe: ModelsProbe, process: ServerProcess, *, owner: str | None = OWNER,
         replace: bool = False) -> ServerLaunch:
    return plan_server(SPEC, Observation(probe, None, process), EXPECTED, owner,
                       replace_mismatched=replace)


def drive(launch: ServerLaunch, **results: Any) -> tuple[list[Command], ServerOutcome]:
    """Run the launch as the launcher does: each named command's result is the canned one."""
    ran: list[Command] = []
    step = next_command(launch)
    while isinstance(step, Command):
        assert step not in ran, f"{step} named twice: {ran}"
        ran.append(step)
        launch = launch.record(step, results[step.value])
        step = next_command(launch)
    return ran, step


def test_a_silent_port_without_a_process_gets_a_server_started() -> None:
    ran, out = drive(plan(SILENT, DEAD), start={"pid": "321"})
    assert ran == [Command.START]
    assert (out.action, out.pid, out.started_by_this_run, out.leased) == (
        "started", 321, True, True)


def test_a_start_without_a_pid_reads_the_log_and_fails_with_its_tail() -> None:
    ran, out = drive(plan(SILENT, DEAD), start={"pid": ""}, read_log="Traceback ...")
    assert ran == [Command.START, Command.READ_LOG]
    assert out.action == "failed" and out.detail.endswith("log tail:\nTraceback ...")


def test_a_start_that_found_another_runs_server_under_the_lock_leases_it() -> None:
    ran, out = drive(plan(SILENT, DEAD), start={"pid": "77", "already": "1"})
    assert ran == [Command.START]
    assert (out.action, out.started_by_this_run, out.leased) == ("loading", False, True)


def test_a_matching_server_is_leased_and_reused() -> None:
    leased = ServerProcess(4242, True, "dag/run 1", 2)
    ran, out = drive(plan(answering(), ALIVE), lease=leased)
    assert ran == [Command.LEASE]
    assert (out.action, out.leased, out.started_by_this_run) == ("reused", True, False)
    assert out.detail.endswith("leases now: 2")


def test_without_an_owner_nothing_is_run_on_the_host() -> None:
    ran, out = drive(plan(answering(), ALIVE, owner=None))
    assert ran == [] and (out.action, out.leased) == ("reused", False)
    ran, out = drive(plan(SILENT, ALIVE, owner=None))
    assert ran == [] and out.action == "loading"


def test_a_server_stopped_between_probe_and_lease_is_started_anew_once_its_port_is_silent(
) -> None:
    ran, out = drive(plan(answering(), ALIVE), lease=DEAD,
                     reprobe=False, start={"pid": "500"})
    assert ran == [Command.LEASE, Command.REPROBE, Command.START]
    assert (out.action, out.pid, out.started_by_this_run) == ("started", 500, True)
    # Still answering (another launch got there first): reused as it is.
    ran, out = drive(plan(answering(), ALIVE), lease=DEAD, reprobe=True)
    assert ran == [Command.LEASE, Command.REPROBE] and out.action == "reused"


def test_a_loading_server_is_leased_for_the_health_gate() -> None:
    ran, out = drive(plan(SILENT, ALIVE), lease=ALIVE)
    assert ran == [Command.LEASE]
    assert (out.action, out.leased) == ("loading", True) and "health gate waits" in out.detail


def test_a_mismatch_is_refused_without_a_command_unless_replacing_is_allowed() -> None:
    ran, out = drive(plan(answering(SHORT), ALIVE))
    assert ran == [] and out.action == "mismatched" and "4096" in out.differences[0]
    ran, out = drive(plan(answering(SHORT), ALIVE, replace=True),
                     release={"outcome": "stopped", "pid": "4242"}, start={"pid": "600"})
    assert ran == [Command.RELEASE, Command.START]
    assert (out.action, out.pid) == ("replaced", 600) and "4096" in out.differences[0]


def test_a_replacement_checks_the_port_only_when_the_release_found_no_process() -> None:
    mismatched = plan(answering(SHORT), ALIVE, replace=True)
    ran, out = drive(mismatched, release={"outcome": "not-running"}, port_check=True)
    assert ran == [Command.RELEASE, Command.PORT_CHECK]
    assert out.action == "failed" and "launched by hand or elsewhere" in out.detail
    ran, out = drive(mismatched, release={"outcome": "not-running"}, port_check=False,
                     start={"pid": "601"})
    assert ran == [Command.RELEASE, Command.PORT_CHECK, Command.START]
    assert out.action == "replaced"
    ran, out = drive(mismatched, release={"outcome": "kept", "leases": "1", "holders": "b"})
    assert ran == [Command.RELEASE] and out.action == "mismatched"
    assert "1 other run(s) lease it (b)" in out.detail


# --- stopping -----------------------------------------------------------------------------
def outcome(started: bool, leased: bool, action: str = "started") -> ServerOutcome:
    return ServerOutcome(SPEC, action, started, 55, leased=leased)  # type: ignore[arg-type]


def test_servers_the_run_neither_started_nor_leased_are_skipped_without_a_release() -> None:
    assert not run_holds(outcome(False, False, "mismatched"))
    assert stop_verdict(outcome(False, False, "mismatched")) == (
        "skipped", f"{SPEC.name}: mismatched, not started or leased by this run")
    assert run_holds(outcome(False, True)) and run_holds(outcome(True, False))
    assert stop_verdict(outcome(False, True)) is Command.RELEASE


def test_the_release_line_decides_kept_left_behind_or_skipped() -> None:
    held = outcome(True, True)
    kept = stop_verdict(held, {"outcome": "kept", "leases": "1", "holders": "other/run"})
    assert kept == ("kept", f"{SPEC.name}: kept for 1 other run(s) leasing it (other/run); "
                            "this run's lease released")
    bucket, line = stop_verdict(held, {"outcome": "still-alive", "pid": "9"})
    assert bucket == "left_behind" and "stop it by hand on gpu-a" in line
    reused = outcome(False, True, "reused")
    assert stop_verdict(reused, {"outcome": "not-running"}) == (
        "skipped", f"{SPEC.name}: reused, not started by a launcher; left running")


def test_a_stopped_server_is_gone_only_once_its_port_refuses() -> None:
    held = outcome(True, True)
    release = {"outcome": "stopped", "pid": "9"}
    assert stop_verdict(held, release) is Command.WAIT_CLOSED
    assert stop_verdict(held, release, port_answers=False) == (
        "stopped", f"{SPEC.name}: stopped pid 9")
    bucket, line = stop_verdict(held, release, port_answers=True)
    assert bucket == "left_behind" and "port 30001" in line and "process 9" in line
    # A server we started whose pid file is gone: its pid comes from the launch report.
    bucket, line = stop_verdict(held, {"outcome": "not-running"}, port_answers=True)
    assert bucket == "left_behind" and "process 55" in line


def test_a_teardown_whose_host_cannot_be_reached_leaves_the_server_behind() -> None:
    held = ServerOutcome(SPEC, "started", True, 55, leased=True)
    assert stop_verdict(held) is Command.RELEASE
    bucket, line = stop_verdict(held, {"outcome": "unreachable", "error": "auth failed"})
    assert (bucket, line) == ("left_behind", f"{SPEC.name}: auth failed")
