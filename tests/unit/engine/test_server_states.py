"""The pool's server states as pure decisions: plain state and an observation in, a step out."""

from __future__ import annotations

import pytest

from include.engine import server_states as st
from include.engine.server_states import PROBES_TO_EJECT, Policy, ServerHealth

POLICY = Policy(cool_down_after_failures=3, cool_down_s=5.0, cool_down_max_s=30.0)


def fail(h: ServerHealth, seq: int, prompt: str = "p", *, sent: int | None = None,
         now: float = 100.0, refused: bool = False) -> st.Step:
    return st.request_failed(h, POLICY, prompt_id=prompt, seq=seq,
                             sent=seq if sent is None else sent, now=now,
                             failure="http_5xx boom", refused=refused)


def streak(h: ServerHealth, n: int, first_seq: int = 1, now: float = 100.0) -> st.Step:
    step = st.Step(h)
    for i in range(n):
        step = fail(step.state, first_seq + i, f"p{i}", now=now)
    return step


def test_a_fresh_server_is_in_rotation_with_its_whole_window() -> None:
    h = ServerHealth()
    assert h.state == "in rotation" and not h.limited
    assert h.free(window=4, in_flight=1, now=0.0) == 3
    assert st.dispatched(h, 1) is h  # no trial for a server in rotation


def test_a_failure_streak_rests_the_server_for_the_cool_down() -> None:
    two = streak(ServerHealth(), 2)
    assert two.action == "" and two.state.state == "in rotation"
    three = fail(two.state, 3, "p2", now=100.0)
    assert three.action == st.REST and three.rest_s == 5.0
    h = three.state
    assert h.state == "resting" and h.cool_until == 105.0 and h.cool_downs == 1
    assert "3 failures in a row, last: http_5xx boom" in three.reason
    assert h.free(window=4, in_flight=0, now=104.9) == 0
    assert h.free(window=4, in_flight=0, now=105.0) == 1  # over: one trial may go


def test_a_failure_during_a_cool_down_starts_no_second_one() -> None:
    h = streak(ServerHealth(), 3).state
    later = fail(h, 2, "p9")  # sent before the rest, failed during it: not the trial
    assert later.action == "" and later.state.cool_downs == 1


def test_the_trial_goes_once_and_its_failure_doubles_the_rest_up_to_the_cap() -> None:
    h = streak(ServerHealth(), 3).state
    pauses = []
    seq = 3
    for _ in range(5):
        seq += 1
        h = st.dispatched(h, seq)
        assert h.trial == seq and h.free(window=4, in_flight=0, now=10**6) == 0
        step = fail(h, seq, "t")
        assert step.action == st.REST and "its trial request failed" in step.reason
        assert step.charged is False  # a trial's failure is the server's, not the prompt's
        pauses.append(step.rest_s)
        h = step.state
    assert pauses == [10.0, 20.0, 30.0, 30.0, 30.0]
    assert h.cool_level == 6 and h.trial == 0


def test_a_success_sent_after_the_rest_began_ends_it() -> None:
    h = st.dispatched(streak(ServerHealth(), 3).state, 4)
    step = st.request_succeeded(h, 4)
    assert step.action == st.BACK
    assert step.state.state == "in rotation" and step.state.cool_level == 0
    assert step.state.trial == 0 and step.state.consecutive_failures == 0


def test_a_success_sent_before_the_rest_or_the_streak_proves_nothing() -> None:
    resting = streak(ServerHealth(), 3, first_seq=2).state
    assert st.request_succeeded(resting, 1).state.state == "resting"
    one = fail(ServerHealth(), 5, sent=5).state
    assert st.request_succeeded(one, 4).state.consecutive_failures == 1
    assert st.request_succeeded(one, 6).state.consecutive_failures == 0


def test_only_a_prompt_failing_alone_on_a_working_server_is_charged() -> None:
    first = fail(ServerHealth(), 1, "poison")
    assert first.charged is True
    again = fail(first.state, 2, "poison")
    assert again.charged is True  # the same prompt alone: the prompt's fault
    mixed = fail(again.state, 3, "other")
    assert mixed.charged is False and mixed.state.streak_mixed
    # Once mixed, the streak stays the server's, whichever prompt fails next.
    assert fail(st.request_succeeded(mixed.state, 1).state, 4, "poison").charged is False


def test_a_refused_connection_ejects_at_once_and_charges_nobody() -> None:
    step = fail(ServerHealth(), 1, refused=True)
    assert step.action == st.EJECT and step.charged is False
    assert step.state.state == "ejected" and step.state.ejections == 1
    assert step.state.ejected_reason == "connection refused (http_5xx boom)"
    assert step.state.free(window=4, in_flight=0, now=0.0) == 0
    # Ejecting an ejected server changes nothing and counts nothing.
    assert st.eject(step.state, "again").action == ""


def test_one_failed_probe_rests_and_a_passing_one_ends_the_rest() -> None:
    step = st.probed(ServerHealth(), POLICY, ok=False, refused=False, detail="/health answered 503")
    assert step.action == st.PROBE_REST and step.state.state == "resting"
    assert step.state.free(window=4, in_flight=0, now=10**6) == 0
    second = st.probed(step.state, POLICY, ok=False, refused=False, detail="again")
    assert second.action == "" and second.state.failed_probes == 2
    back = st.probed(second.state, POLICY, ok=True, refused=False, detail="")
    assert back.action == st.PROBE_PASSED and back.state.state == "in rotation"
    assert st.probed(back.state, POLICY, ok=True, refused=False, detail="").action == ""


def test_probes_to_eject_failed_probes_in_a_row_eject() -> None:
    h = ServerHealth()
    for _ in range(PROBES_TO_EJECT - 1):
        h = st.probed(h, POLICY, ok=False, refused=False, detail="timeout").state
    assert h.state == "resting"
    step = st.probed(h, POLICY, ok=False, refused=False, detail="/health answered 503")
    assert step.action == st.EJECT and step.state.state == "ejected"
    assert step.reason == (
        f"{PROBES_TO_EJECT} health probes failed in a row, last: /health answered 503")
    # Probes failing on an ejected server change nothing.
    assert st.probed(step.state, POLICY, ok=False, refused=False, detail="x").state == step.state


def test_a_refused_probe_ejects_at_once() -> None:
    step = st.probed(ServerHealth(), POLICY, ok=False, refused=True, detail="/health refused")
    assert step.action == st.EJECT and step.reason == "/health refused"


@pytest.mark.parametrize("how", ["refused request", "probes"])
def test_a_passing_probe_readmits_an_ejected_server_with_a_clean_slate(how: str) -> None:
    h = streak(ServerHealth(), 3).state  # resting, with a cool-down level, then gone
    if how == "refused request":
        h = fail(h, 9, refused=True).state
    else:
        for _ in range(PROBES_TO_EJECT):
            h = st.probed(h, POLICY, ok=False, refused=False, detail="x").state
    assert h.state == "ejected"
    step = st.probed(h, POLICY, ok=True, refused=False, detail="/health answered 200")
    assert step.action == st.READMIT
    new = step.state
    assert new.state == "in rotation" and new.ejections == 1
    assert (new.consecutive_failures, new.failed_probes, new.cool_level, new.trial) == (0, 0, 0, 0)
    assert new.cool_downs == 1  # the history stays for the stats


def test_an_ejected_server_gets_no_cool_down_from_a_late_failure() -> None:
    gone = fail(ServerHealth(), 1, refused=True).state
    assert streak(gone, 3, first_seq=2).action == ""


def test_a_server_unreachable_at_start_is_out_but_never_counted_as_ejected() -> None:
    h = st.unreachable_at_start(ServerHealth(), "unreachable at start (ClientConnectorError)")
    assert h.state == "ejected" and h.ejections == 0
    assert st.probed(h, POLICY, ok=True, refused=False, detail="").action == st.READMIT
