"""A server's rest, ejection and re-admission as pure decisions: state + observation → step.

Like ``retry.py`` (a failed request's verdict), nothing here does I/O or reads a clock: the
pool passes what it saw (a request's result, a health probe's result, the time now, how many
requests it has sent the server) and applies the ``Step`` it gets back (logging, cancelling
the in-flight work of an ejected server, waking the dispatcher when a rest ends).

A server is in one of three states:

* **in rotation**: takes requests up to its in-flight window.
* **resting**: ``cool_down_after_failures`` retryable failures in a row, or a failed health
  probe. No new requests; its in-flight ones run on. After a failure streak it rests for
  ``cool_down_s`` (doubled for each cool-down in a row, at most ``cool_down_max_s``), then takes
  one trial request: a success ends the rest, a failure starts the next, longer one. After a
  failed probe it rests until a probe passes.
* **ejected**: gone: it refused a connection, or failed ``PROBES_TO_EJECT`` probes in a row.
  Its in-flight requests are taken back; a probe answering 200 re-admits it.

Requests are numbered per server in the order sent (``seq``, from 1): only a request sent
after a streak or a cool-down began can end it, since an older one proves nothing about now.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from include.outcomes import ServerStatus

#: Health probes failed in a row (timeout or not 200) after which a server counts as gone.
#: One failed probe only rests it: a loaded host can miss one without losing its work.
PROBES_TO_EJECT = 3

#: What a step asks the pool to do (``Step.action``); "" for nothing but the new state.
REST = "rest"  # a cool-down began: no new requests for ``Step.rest_s`` seconds
BACK = "back"  # a request sent after the cool-down began succeeded: back in rotation
PROBE_REST = "probe_rest"  # the first failed probe: no new requests until one passes
PROBE_PASSED = "probe_passed"  # a probe passes again after failing
EJECT = "eject"  # gone: take back (cancel) its in-flight requests
READMIT = "readmit"  # an ejected server's probe passes: back in rotation


@dataclass(frozen=True)
class Policy:
    """The run's settings that shape rests and ejection."""

    cool_down_after_failures: int
    cool_down_s: float
    cool_down_max_s: float
    probes_to_eject: int = PROBES_TO_EJECT


@dataclass(frozen=True)
class ServerHealth:
    """One server's rest and ejection state, as plain data."""

    #: False once ejected (gone), until a probe passes.
    healthy: bool = True
    consecutive_failures: int = 0
    #: The first prompt of the current failure streak, and whether the streak holds others.
    streak_prompt: str | None = None
    streak_mixed: bool = False
    #: Requests sent when the streak began: only a later one can end it.
    streak_from: int = 0
    #: When the current cool-down ends (0.0: none), and how many came in a row.
    cool_until: float = 0.0
    cool_level: int = 0
    #: Requests sent when the cool-down began: only a later one can end it.
    cool_from: int = 0
    #: ``seq`` of the trial request in flight after a cool-down (0: none).
    trial: int = 0
    failed_probes: int = 0
    ejections: int = 0
    cool_downs: int = 0
    ejected_reason: str = ""

    @property
    def cooling(self) -> bool:
        """Return whether a failure streak has put the server in a cool-down."""
        return self.cool_until > 0.0

    @property
    def limited(self) -> bool:
        """Return whether the server is not plainly in rotation (resting or ejected)."""
        return not self.healthy or bool(self.failed_probes) or self.cooling

    @property
    def state(self) -> ServerStatus:
        """Return the server's ``ServerStatus``."""
        if not self.healthy:
            return ServerStatus.EJECTED
        return ServerStatus.RESTING if self.limited else ServerStatus.IN_ROTATION

    def free(self, window: int, in_flight: int, now: float) -> int:
        """Return how many more requests the server may take at time ``now``."""
        if not self.limited:
            return window - in_flight
        if not self.healthy or self.failed_probes or self.trial:
            return 0
        return 1 if now >= self.cool_until else 0


@dataclass(frozen=True)
class Step:
    """A decision: the new state, what to do, and why (for the log)."""

    state: ServerHealth
    action: str = ""
    reason: str = ""
    #: For ``REST``: how long the cool-down lasts.
    rest_s: float = 0.0
    #: For a failed request: whether it counts against its prompt.
    charged: bool = False


def dispatched(health: ServerHealth, seq: int) -> ServerHealth:
    """Return the state once request ``seq`` is sent: to a resting server it is the trial."""
    return replace(health, trial=seq) if health.limited else health


def request_succeeded(health: ServerHealth, seq: int) -> Step:
    """Decide on a request that came back complete.

    One sent after the failure streak (or cool-down) began ends it; one sent before proves
    nothing: a brownout starts with old requests still finishing, and letting them end the
    streak would make each next failure the first of a new streak, charged to its prompt.
    """
    new = health
    if seq > health.streak_from and health.consecutive_failures:
        new = replace(new, consecutive_failures=0)
    if health.cooling and seq > health.cool_from:
        return Step(replace(new, cool_until=0.0, cool_level=0, trial=0), BACK,
                    "answered again: back in rotation after its cool-down")
    return Step(new)


def request_failed(
    health: ServerHealth,
    policy: Policy,
    *,
    prompt_id: str,
    seq: int,
    sent: int,
    now: float,
    failure: str,
    refused: bool = False,
) -> Step:
    """Decide on a retryable failure of request ``seq`` (``sent``: requests sent so far).

    It counts against the prompt only when the server was working for others: not resting,
    not on its trial, and not already failing other prompts (a brownout is the server's
    fault, a prompt that fails alone is the prompt's). A refused connection ejects the
    server; a streak of ``cool_down_after_failures``, or a failed trial, rests it.
    """
    if refused:
        return eject(health, f"connection refused ({failure})")
    if health.consecutive_failures == 0:
        prompt, mixed, since = prompt_id, False, sent
    else:
        prompt, since = health.streak_prompt, health.streak_from
        mixed = health.streak_mixed or prompt_id != prompt
    failures = health.consecutive_failures + 1
    charged = not health.limited and not mixed
    was_trial = seq == health.trial
    new = replace(health, consecutive_failures=failures, streak_prompt=prompt,
                  streak_mixed=mixed, streak_from=since, trial=0 if was_trial else health.trial)
    if new.healthy and (
        was_trial or (not new.cooling and failures >= policy.cool_down_after_failures)
    ):
        what = "its trial request failed" if was_trial else f"{failures} failures in a row, last"
        return _cool(new, policy, now, sent, f"{what}: {failure}", charged)
    return Step(new, charged=charged)


def _cool(
    health: ServerHealth, policy: Policy, now: float, sent: int, reason: str, charged: bool
) -> Step:
    pause = min(policy.cool_down_max_s, policy.cool_down_s * 2 ** health.cool_level)
    new = replace(health, cool_level=health.cool_level + 1, cool_downs=health.cool_downs + 1,
                  cool_until=now + pause, cool_from=sent)
    return Step(new, REST, reason, rest_s=pause, charged=charged)


def probed(health: ServerHealth, policy: Policy, *, ok: bool, refused: bool, detail: str) -> Step:
    """Decide on one ``/health`` probe (``refused``: the connection was refused)."""
    if ok:
        if not health.healthy:
            return readmitted(health)
        if health.failed_probes:
            return Step(replace(health, failed_probes=0), PROBE_PASSED,
                        "passes its health probe again")
        return Step(health)
    if not health.healthy:
        return Step(health)
    failed = health.failed_probes + 1
    new = replace(health, failed_probes=failed)
    if refused or failed >= policy.probes_to_eject:
        return eject(new, detail if refused else
                     f"{failed} health probes failed in a row, last: {detail}")
    if failed == 1:
        return Step(new, PROBE_REST, detail)
    return Step(new)


def eject(health: ServerHealth, reason: str) -> Step:
    """Decide to take a gone server out of rotation (nothing if it is out already)."""
    if not health.healthy:
        return Step(health)
    return Step(replace(health, healthy=False, ejections=health.ejections + 1,
                        ejected_reason=reason), EJECT, reason)


def readmitted(health: ServerHealth) -> Step:
    """Decide to put an ejected server back in rotation, every streak and rest forgotten."""
    return Step(replace(health, healthy=True, consecutive_failures=0, failed_probes=0,
                        cool_until=0.0, cool_level=0, trial=0), READMIT,
                "re-admitted: /health is 200 again")


def unreachable_at_start(health: ServerHealth, reason: str) -> ServerHealth:
    """Return the state of a server that did not answer before the run: out until a probe
    passes, though never counted as ejected (it never took work)."""
    return replace(health, healthy=False, ejected_reason=reason)
