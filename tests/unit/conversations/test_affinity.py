"""Conversation affinity: stay on the server holding the history unless it cannot serve."""

from __future__ import annotations

import pytest

from include.conversations.affinity import Choice, ServerView, choose_server
from include.outcomes import ServerStatus

IN_ROTATION, RESTING, EJECTED = ServerStatus


def view(url: str, in_flight: int = 0, window: int = 8, state: str = IN_ROTATION) -> ServerView:
    free = window - in_flight if state == IN_ROTATION else 0
    return ServerView(url, state, in_flight, window, free)


def test_a_first_turn_goes_to_the_least_loaded_server() -> None:
    servers = [view("a", 6), view("b", 2), view("c", 4)]
    assert choose_server(None, servers) == Choice("b", False, "first_turn", True)


def test_least_loaded_is_by_window_share_then_room_then_url() -> None:
    # 4/16 = 2/8 in share: the one with more room wins; then the url decides.
    assert choose_server(None, [view("a", 2, 8), view("b", 4, 16)]).url == "b"
    assert choose_server(None, [view("b", 1), view("a", 1)]).url == "a"


def test_a_turn_stays_on_its_server_when_it_is_not_far_busier() -> None:
    servers = [view("a", 5), view("b", 1)]  # a at 0.625, b at 0.125: 0.5 apart
    assert choose_server("a", servers) == Choice("a", False, "kept", True)


def test_a_turn_stays_and_waits_on_a_full_server_within_the_margin() -> None:
    servers = [view("a", 8), view("b", 6)]
    assert choose_server("a", servers) == Choice("a", False, "kept", False)


def test_a_far_busier_server_loses_the_turn() -> None:
    servers = [view("a", 8), view("b", 1), view("c", 3)]
    assert choose_server("a", servers) == Choice("b", True, "busier", True)
    assert choose_server("a", servers, busier_by=0.9) == Choice("a", False, "kept", False)


@pytest.mark.parametrize(("state", "reason"), [(RESTING, "resting"), (EJECTED, "ejected")])
def test_a_resting_or_ejected_server_loses_the_turn(state: str, reason: str) -> None:
    servers = [view("a", 0, state=state), view("b", 7), view("c", 5)]
    assert choose_server("a", servers) == Choice("c", True, reason, True)


def test_a_server_gone_from_the_pool_loses_the_turn() -> None:
    assert choose_server("x", [view("a", 1)]) == Choice("a", True, "gone", True)


def test_with_no_server_in_rotation_there_is_no_choice() -> None:
    servers = [view("a", state=RESTING), view("b", state=EJECTED)]
    assert choose_server("a", servers) == Choice(None, False, "no_server")
    assert choose_server(None, []) == Choice(None, False, "no_server")


def test_a_zero_window_counts_as_full() -> None:
    assert view("a", 0, 0).load == 1.0
    assert choose_server(None, [view("a", 0, 0), view("b", 7)]).url == "b"


def test_a_negative_margin_is_refused() -> None:
    with pytest.raises(ValueError, match="busier_by"):
        choose_server("a", [view("a")], busier_by=-0.1)
