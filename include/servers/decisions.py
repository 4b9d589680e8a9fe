"""What to do with one of a run's servers, decided from what is there: no SSH, no HTTP.

The launcher reads what is there into plain data (``observations.Observation``: what
``GET /v1/models`` and ``/server_info`` answer, the process record of the pid, owner and lease
files), ``plan_server`` decides (``ServerLaunch.step``); then ``next_command`` names, one at a time,
the command to run (``Command``: lease, start, release, probe ...) until it returns the
server's ``ServerOutcome``. The launcher runs each command it names and records the result in
the ``ServerLaunch`` (``record``); it decides nothing. So every decision is unit-tested on
plain data, without a host (tests/unit/servers)::

    port closed, a process of ours alive -> loading (SGLang opens its port only once the model
                                            is loaded): lease it; the health gate waits for it
                                            and checks it once it answers
    port closed, no process              -> start one
    answers with the run's settings      -> reuse it, under this run's lease (started anew if
                                            it was stopped between the probe and the lease)
    answers with other settings          -> leave it running (refuse), or with
                                            replace_mismatched_servers release it and start
                                            anew, unless ``replace_blocked`` says why not

Stopping one (``stop_verdict``): release this run's lease; the last lease stops the process;
a stopped server counts as gone once its port refuses connections.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from include.servers.commands import ServerSpec
from include.servers.expectations import (
    ModelExpectation,
    served_model_differences,
    speculative_differences,
)
from include.servers.launch_report import Action, ServerOutcome
from include.servers.observations import ModelsProbe, Observation, ServerProcess

#: ``loading``: the pid file names a live server process whose port is closed. Real SGLang
#: binds its port only after loading the weights and capturing CUDA graphs (minutes for a
#: 27B model), so the process is loading; starting another would only fail to bind.
LaunchStep = Literal["loading", "start", "reuse", "refuse", "replace"]
#: Which ``StopReport`` list a server's teardown ends in.
StopBucket = Literal["stopped", "kept", "left_behind", "skipped"]


class Command(StrEnum):
    """A command a decision names for one server; the launcher runs it and records its result."""

    LEASE = "lease"  # add this run's lease under the lock: the process record then
    START = "start"  # the detached launch command: the fields it printed
    READ_LOG = "read_log"  # the log's last lines, the key redacted (no pid appeared)
    RELEASE = "release"  # drop this run's lease, stop the process if it was the last one
    REPROBE = "reprobe"  # GET /v1/models again, with the key: does it answer now?
    PORT_CHECK = "port_check"  # GET /v1/models without the key: does anything answer?
    WAIT_CLOSED = "wait_closed"  # teardown: does the port still answer after a short wait?


#: Where ``ServerLaunch.record`` keeps each command's result.
_RESULT = {Command.LEASE: "leased", Command.START: "launched", Command.READ_LOG: "log_tail",
           Command.RELEASE: "released", Command.REPROBE: "answers_again",
           Command.PORT_CHECK: "port_answers"}


@dataclass(frozen=True)
class ServerLaunch:
    """One server's launch: what was there, what was decided, what each command returned."""

    spec: ServerSpec
    owner: str | None
    step: LaunchStep
    differences: list[str]
    found: ServerProcess
    leased: ServerProcess | None = None
    answers_again: bool | None = None
    released: Mapping[str, str] | None = None
    port_answers: bool | None = None
    launched: Mapping[str, str] | None = None
    log_tail: str | None = None

    def record(self, command: Command, result: Any) -> ServerLaunch:
        """Return this launch with ``command``'s result where ``next_command`` reads it."""
        return dataclasses.replace(self, **{_RESULT[command]: result})


def probe_differences(
    probe: ModelsProbe, expected: ModelExpectation, sglang_conn_id: str | None = None
) -> list[str]:
    """Return how an answering server differs from the run ([] means reusable)."""
    if probe.status == 401:
        return [
            "answers 401 Unauthorized: it was started with another API key than the password "
            f"of Airflow connection {sglang_conn_id!r} (REGEN_SGLANG_CONN_ID)"
        ]
    if probe.status != 200:
        return [f"/v1/models answered {probe.status}: {probe.error}"]
    return served_model_differences(probe.body, expected)


def launch_step(
    probe: ModelsProbe,
    alive: bool,
    expected: ModelExpectation,
    *,
    replace_mismatched: bool,
    sglang_conn_id: str | None = None,
    server_info: Any = None,
) -> tuple[LaunchStep, list[str]]:
    """Return what to do with a server, and how it differs from the run when it answers.

    ``alive``: the server's pid file names a live process (read only when the port is closed).
    A loading server is not checked here: the health gate checks it once its port opens.
    ``server_info``: its ``/server_info`` JSON (None: not read), compared with the
    speculation ``expected`` wants, so a drafter's server never serves a target-only run and
    a target-only server never a drafter's pass.
    """
    if not probe.answering:
        return ("loading" if alive else "start"), []
    differences = probe_differences(probe, expected, sglang_conn_id)
    if not differences:
        differences = speculative_differences(server_info, expected.speculative)
    if not differences:
        return "reuse", []
    return ("replace" if replace_mismatched else "refuse"), differences


def plan_server(
    spec: ServerSpec,
    seen: Observation,
    expected: ModelExpectation,
    owner: str | None,
    *,
    replace_mismatched: bool,
    sglang_conn_id: str | None = None,
) -> ServerLaunch:
    """Return the launch of one server decided from what is there (``launch_step``)."""
    step, differences = launch_step(
        seen.probe, seen.process.alive, expected, replace_mismatched=replace_mismatched,
        sglang_conn_id=sglang_conn_id, server_info=seen.server_info,
    )  # fmt: skip
    return ServerLaunch(spec, owner, step, differences, seen.process)


def next_command(launch: ServerLaunch) -> Command | ServerOutcome:
    """Return the next command to run for ``launch``, or its outcome once nothing is left."""
    spec, found = launch.spec, launch.found
    if launch.launched is not None:
        pid = launch.launched.get("pid", "")
        if not pid.isdigit() and launch.log_tail is None:
            return Command.READ_LOG
        action: Action = "replaced" if launch.step == "replace" else "started"
        outcome = started_outcome(spec, action, launch.owner, pid, launch.log_tail or "",
                                  already=launch.launched.get("already") == "1")
        return dataclasses.replace(outcome, differences=list(launch.differences))
    if launch.step == "start":
        return Command.START
    if launch.step == "refuse":
        return refused_outcome(spec, found, launch.differences)
    if launch.step in ("reuse", "loading"):
        return _held(launch)
    if launch.released is None:  # replace: this run's lease first; the last one stops it
        return Command.RELEASE
    if launch.released.get("outcome") == "not-running" and launch.port_answers is None:
        return Command.PORT_CHECK
    blocked = replace_blocked(spec, found, launch.released, launch.differences,
                              port_answers=bool(launch.port_answers))
    return Command.START if blocked is None else blocked


def _held(launch: ServerLaunch) -> Command | ServerOutcome:
    """Lease a server answering (reuse) or loading; start it if it is gone meanwhile."""
    outcome = loading_outcome if launch.step == "loading" else reused_outcome
    spec, owner, found = launch.spec, launch.owner, launch.found
    owned = found.owned_by(owner)
    if not owner:
        return outcome(spec, owner, owned, found)
    if launch.leased is None:
        return Command.LEASE
    if stopped_meanwhile(found, launch.leased):
        if launch.answers_again is None:
            return Command.REPROBE
        if not launch.answers_again:
            return Command.START
    return outcome(spec, owner, owned, found, launch.leased)


def refused_outcome(
    spec: ServerSpec, process: ServerProcess, differences: list[str]
) -> ServerOutcome:
    """Return a mismatched server left running because replacing is not allowed."""
    return ServerOutcome(
        spec, "mismatched", False, process.pid,
        "left running; set `replace_mismatched_servers`: true to replace it", differences,
    )  # fmt: skip


def replace_blocked(
    spec: ServerSpec,
    process: ServerProcess,
    release: Mapping[str, str],
    differences: list[str],
    *,
    port_answers: bool = False,
) -> ServerOutcome | None:
    """Return why a mismatched server cannot be replaced after releasing it, or None: start.

    ``release`` holds the fields the release command printed; ``port_answers`` whether the
    port still answers although the release found no process of ours (probed only then).
    """
    what = release.get("outcome")
    if what == "kept":
        return ServerOutcome(
            spec, "mismatched", False, process.pid,
            f"not replaced: {release.get('leases')} other run(s) lease it "
            f"({release.get('holders')}) and generate on it; run this one after they finish, "
            "or on other GPUs",
            differences,
        )  # fmt: skip
    if what == "not-running" and port_answers:
        return ServerOutcome(
            spec, "failed", False, process.pid,
            f"cannot replace it: {spec.url} is served by a process not started from "
            f"{spec.paths.pid_file} (launched by hand or elsewhere); stop it yourself",
            differences,
        )  # fmt: skip
    if what == "still-alive":
        return ServerOutcome(
            spec, "failed", False, process.pid,
            f"cannot replace it: process {release.get('pid')} survived SIGTERM and SIGKILL",
            differences,
        )  # fmt: skip
    return None


def stopped_meanwhile(before: ServerProcess, leased: ServerProcess) -> bool:
    """Return whether a server alive at the probe had no process once leased (another run's
    teardown stopped it in between: a probe confirms it, then it is started anew)."""
    return before.alive and not leased.alive


def reused_outcome(
    spec: ServerSpec,
    owner: str | None,
    owned: bool,
    before: ServerProcess,
    leased: ServerProcess | None = None,
) -> ServerOutcome:
    """Return the reuse of a matching server; ``leased``: its process once this run leased it."""
    detail = "answers with the run's model and context length"
    if owned:
        detail += f"; started earlier by this run ({owner})"
    if leased is None:
        return ServerOutcome(spec, "reused", owned, before.pid, detail)
    return ServerOutcome(
        spec, "reused", owned, leased.pid, f"{detail}; leases now: {leased.leases}", leased=True
    )


def loading_outcome(
    spec: ServerSpec,
    owner: str | None,
    owned: bool,
    before: ServerProcess,
    leased: ServerProcess | None = None,
) -> ServerOutcome:
    """Return a server found loading its model; ``leased``: its process once this run leased it.

    It serves the run like a started or reused one (its URL is the run's, it is no problem):
    the health gate waits for its port to open, then checks its model and context length.
    """
    detail = (f"process {before.pid} (pid file {spec.paths.pid_file}) is alive and its port "
              "is closed: loading its model; the health gate waits for it")
    detail += (f"; started earlier by this run ({owner})" if owned
               else f"; started by {before.owner or 'a launcher'}")
    if leased is None:
        return ServerOutcome(spec, "loading", owned, before.pid, detail)
    return ServerOutcome(
        spec, "loading", owned, leased.pid, f"{detail}; leases now: {leased.leases}",
        leased=True,
    )  # fmt: skip


def started_outcome(
    spec: ServerSpec, action: Action, owner: str | None, pid: str, log_tail: str = "",
    *, already: bool = False,
) -> ServerOutcome:
    """Return what a launch command did, from the ``pid`` it printed ('' when none).

    Without a pid the server still counts as started by this run: the process may exist
    without its pid file, and teardown then tries to stop it. ``already``: once the command
    held the lock it found a live server that another run's launch had just started; it
    leased that one and started nothing (the gate waits for it like a loading server).
    """
    paths = spec.paths
    if already and pid.isdigit():
        return ServerOutcome(
            spec, "loading", False, int(pid),
            f"process {pid} was started by another run's launch while this one waited for the "
            f"lock {paths.lock_file}; leased, not started again; the health gate waits for it",
            leased=bool(owner),
        )  # fmt: skip
    if not pid.isdigit():
        return ServerOutcome(
            spec, "failed", True, None,
            f"no pid file {paths.pid_file} appeared after launch; log tail:\n{log_tail}",
            leased=bool(owner),
        )  # fmt: skip
    return ServerOutcome(
        spec, action, True, int(pid), f"log {paths.log_file}, pid file {paths.pid_file}",
        leased=bool(owner),
    )  # fmt: skip


def run_holds(outcome: ServerOutcome) -> bool:
    """Return whether the run started or leased the server (so teardown must release it)."""
    return outcome.leased or outcome.started_by_this_run


def stop_verdict(
    outcome: ServerOutcome,
    released: Mapping[str, str] | None = None,
    *,
    port_answers: bool | None = None,
) -> tuple[StopBucket, str] | Command:
    """Return where a server's teardown ends and the line saying so, or the command to run.

    With the launch outcome alone: ``Command.RELEASE`` (this run's lease); with the fields
    the release printed (``outcome=unreachable error=...`` when its host could not be
    reached): ``Command.WAIT_CLOSED`` when the process is gone, to confirm its port closed;
    then with ``port_answers``: whether the port still answered after the wait.
    """
    spec = outcome.server
    if not run_holds(outcome):
        return "skipped", f"{spec.name}: {outcome.action}, not started or leased by this run"
    if released is None:
        return Command.RELEASE
    what = released.get("outcome", "?")
    if what == "unreachable":
        return "left_behind", f"{spec.name}: {released.get('error')}"
    if what == "kept":
        return "kept", (
            f"{spec.name}: kept for {released.get('leases')} other run(s) leasing it "
            f"({released.get('holders')}); this run's lease released"
        )
    if what == "still-alive":
        return "left_behind", (
            f"{spec.name}: process {released.get('pid')} survived SIGTERM and SIGKILL; "
            f"stop it by hand on {spec.host}"
        )
    if what == "not-running" and not outcome.started_by_this_run:
        return "skipped", f"{spec.name}: reused, not started by a launcher; left running"
    if port_answers is None:
        return Command.WAIT_CLOSED
    if port_answers:
        # The pid is gone but something answers: another process serves the port now.
        return "left_behind", (
            f"{spec.name}: process {released.get('pid') or outcome.pid} is gone but "
            f"{spec.url} still answers; find what listens on port {spec.port}"
        )
    return "stopped", f"{spec.name}: {what} pid {released.get('pid') or '-'}"
