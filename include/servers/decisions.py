"""What to do with one of a run's servers, decided from what was observed: no SSH, no HTTP.

``launcher.py`` observes (``GET /v1/models``; the pid, owner and lease files read over SSH),
asks these functions what to do and does it. They take plain data and return the next step or
the final outcome, so every decision is unit-tested without a host (tests/unit/servers).

Launching one server (``launch_step``)::

    port closed, a process of ours alive -> it is loading (SGLang opens its port only once the
                                            model is loaded): lease it; the health gate waits
                                            for it and checks it once it answers
    port closed, no process              -> start one
    answers with the run's settings      -> reuse it, under this run's lease
    answers with other settings          -> leave it running (refuse), or with
                                            replace_mismatched_servers release it and start
                                            anew, unless ``replace_blocked`` says why not

Stopping one (``stop_verdict``): release this run's lease; the last lease stops the process;
a stopped server counts as gone once its port refuses connections.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from include.servers.commands import ServerSpec, parse_fields
from include.servers.expectations import (
    ModelExpectation,
    served_model_differences,
    speculative_differences,
)
from include.servers.launch_report import Action, ServerOutcome

#: ``loading``: the pid file names a live server process whose port is closed. Real SGLang
#: binds its port only after loading the weights and capturing CUDA graphs (minutes for a
#: 27B model), so the process is loading; starting another would only fail to bind.
LaunchStep = Literal["loading", "start", "reuse", "refuse", "replace"]
#: Which ``StopReport`` list a server's teardown ends in.
StopBucket = Literal["stopped", "kept", "left_behind", "skipped"]


@dataclass(frozen=True)
class ServerProcess:
    """One server's process as its host's files record it: pid, alive, who started it, leases.

    Not ``include.outcomes.ServerStatus`` (a server's state in the engine's pool): this is
    what a status, acquire or launch command read from the pid, owner and lease files.
    """

    pid: int | None
    alive: bool
    owner: str
    leases: int = 0

    @classmethod
    def parse(cls, output: str) -> ServerProcess:
        """Read the fields a status, acquire or launch command printed."""
        fields = parse_fields(output)
        pid = fields.get("pid") or ""
        leases = fields.get("leases") or "0"
        return cls(
            int(pid) if pid.isdigit() else None,
            fields.get("alive") == "1",
            fields.get("owner", ""),
            int(leases) if leases.isdigit() else 0,
        )

    def owned_by(self, owner: str | None) -> bool:
        """Return whether run ``owner`` started this server (a retried launch finds its own)."""
        return bool(owner) and self.owner == owner


@dataclass(frozen=True)
class ModelsProbe:
    """Hold one ``GET /v1/models`` outcome: ``answering`` False means nothing listens."""

    answering: bool
    status: int | None = None
    body: Any = None
    error: str = ""


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


def refused_outcome(
    spec: ServerSpec, status: ServerProcess, differences: list[str]
) -> ServerOutcome:
    """Return a mismatched server left running because replacing is not allowed."""
    return ServerOutcome(
        spec, "mismatched", False, status.pid,
        "left running; set `replace_mismatched_servers`: true to replace it", differences,
    )  # fmt: skip


def replace_blocked(
    spec: ServerSpec,
    status: ServerProcess,
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
            spec, "mismatched", False, status.pid,
            f"not replaced: {release.get('leases')} other run(s) lease it "
            f"({release.get('holders')}) and generate on it; run this one after they finish, "
            "or on other GPUs",
            differences,
        )  # fmt: skip
    if what == "not-running" and port_answers:
        return ServerOutcome(
            spec, "failed", False, status.pid,
            f"cannot replace it: {spec.url} is served by a process not started from "
            f"{spec.paths.pid_file} (launched by hand or elsewhere); stop it yourself",
            differences,
        )  # fmt: skip
    if what == "still-alive":
        return ServerOutcome(
            spec, "failed", False, status.pid,
            f"cannot replace it: process {release.get('pid')} survived SIGTERM and SIGKILL",
            differences,
        )  # fmt: skip
    return None


def stopped_meanwhile(before: ServerProcess, leased: ServerProcess) -> bool:
    """Return whether a server alive at the probe had no process once leased.

    Another run's teardown may have stopped it in between; a probe then confirms it is gone
    and the launcher starts it anew.
    """
    return before.alive and not leased.alive


def reused_outcome(
    spec: ServerSpec,
    owner: str | None,
    owned: bool,
    before: ServerProcess,
    leased: ServerProcess | None = None,
) -> ServerOutcome:
    """Return the reuse of a matching server; ``leased``: its status once this run leased it."""
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
    """Return a server found loading its model; ``leased``: its status once this run leased it.

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
    release: Mapping[str, str] | None = None,
    *,
    port_answers: bool | None = None,
) -> tuple[StopBucket, str] | None:
    """Return where a server's teardown ends and the line saying so, or None: observe more.

    Call it first with the launch outcome alone (None: release the run's lease), then with
    the fields the release printed (None: the process is gone, confirm its port closed),
    then with ``port_answers``: whether the port still answered after the wait.
    """
    spec = outcome.server
    if not run_holds(outcome):
        return "skipped", f"{spec.name}: {outcome.action}, not started or leased by this run"
    if release is None:
        return None
    what = release.get("outcome", "?")
    if what == "kept":
        return "kept", (
            f"{spec.name}: kept for {release.get('leases')} other run(s) leasing it "
            f"({release.get('holders')}); this run's lease released"
        )
    if what == "still-alive":
        return "left_behind", (
            f"{spec.name}: process {release.get('pid')} survived SIGTERM and SIGKILL; "
            f"stop it by hand on {spec.host}"
        )
    if what == "not-running" and not outcome.started_by_this_run:
        return "skipped", f"{spec.name}: reused, not started by a launcher; left running"
    if port_answers is None:
        return None
    if port_answers:
        # The pid is gone but something answers: another process serves the port now.
        return "left_behind", (
            f"{spec.name}: process {release.get('pid') or outcome.pid} is gone but "
            f"{spec.url} still answers; find what listens on port {spec.port}"
        )
    return "stopped", f"{spec.name}: {what} pid {release.get('pid') or '-'}"
