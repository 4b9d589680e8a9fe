"""Resume per turn: records replayed over the dataset; duplicates tolerated, gaps refused."""

from __future__ import annotations

import json

import pytest

from include.conversations import chain
from include.conversations.chain import ConversationEnd, after_turn, next_request, start
from include.conversations.resume import ResumeError, resume, turn_record
from tests.unit.conversations.dialogues import IntServer, chat, hermes_parallel


def journaled(state: chain.ChainState, answers: list[str], server: IntServer | None = None
              ) -> tuple[chain.ChainState, list[dict]]:
    """Drive the chain, journaling each turn; return the state and the records (as JSON)."""
    server = server or IntServer()
    records = []
    for text in answers:
        state = after_turn(state, server.answer(next_request(state), text))
        records.append(json.loads(json.dumps(turn_record(state))))
    return state, records


def starts(*states: chain.ChainState) -> dict[str, chain.ChainState]:
    return {s.conversation_id: s for s in states}


def test_a_retry_continues_each_conversation_at_its_next_turn() -> None:
    a, b = start("a", chat(4)), start("b", chat(3))
    a2, rec_a = journaled(a, ["a0", "a1"])
    b1, rec_b = journaled(b, ["b0"])
    resumed = resume([rec_a[0], rec_b[0], rec_a[1]], starts(a, b, start("c", chat(2))))
    assert resumed["a"] == a2 and resumed["b"] == b1
    assert resumed["c"] == start("c", chat(2))
    assert next_request(resumed["a"]) == next_request(a2)
    assert len(next_request(resumed["a"])) == len(next_request(a)) + 4  # a0, user, a1, user


def test_a_finished_conversation_resumes_finished() -> None:
    same_calls = hermes_parallel()[2]["content"]
    done, records = journaled(start("h", hermes_parallel()), [same_calls, "Sunny.", "All."])
    assert done.end == chain.End(ConversationEnd.COMPLETED)
    assert resume(records, starts(start("h", hermes_parallel())))["h"] == done
    assert records[-1]["end"] == {"reason": ConversationEnd.COMPLETED, "detail": ""}


def test_a_duplicated_turn_record_is_taken_once() -> None:
    state, records = journaled(start("a", chat(3)), ["x", "y"])
    again = resume([records[0], records[0], records[1], records[1]], starts(start("a", chat(3))))
    assert again["a"] == state and len(again["a"].turns) == 2
    assert turn_record(state)["id"] == records[1]["id"]  # the journal collapses them too


def test_of_two_tries_of_a_turn_the_one_continued_wins_in_any_order() -> None:
    fresh = start("a", chat(4))
    first, rec_first = journaled(fresh, ["x"])
    _, rec_lost = journaled(first, ["lost try"])
    kept, rec_kept = journaled(first, ["kept try", "then more"])
    assert rec_lost[0]["id"] != rec_kept[0]["id"]  # different tries stay apart in the journal
    for order in ([*rec_first, *rec_lost, *rec_kept], [*rec_kept, *rec_lost, *rec_first]):
        assert resume(order, starts(fresh))["a"] == kept


def test_of_two_tries_with_no_continuation_the_smaller_digest_wins() -> None:
    fresh = start("a", chat(3))
    one, rec_one = journaled(fresh, ["one"])
    two, rec_two = journaled(fresh, ["two"])
    expected = one if rec_one[0]["digest"] < rec_two[0]["digest"] else two
    assert resume(rec_one + rec_two, starts(fresh))["a"] == expected
    assert resume(rec_two + rec_one, starts(fresh))["a"] == expected


def test_a_gap_is_an_error() -> None:
    _, records = journaled(start("a", chat(4)), ["x", "y", "z"])
    with pytest.raises(ResumeError, match="gap"):
        resume([records[0], records[2]], starts(start("a", chat(4))))
    with pytest.raises(ResumeError, match="gap"):
        resume([records[1]], starts(start("a", chat(4))))


def test_a_record_from_another_conversation_text_is_an_error() -> None:
    _, records = journaled(start("a", chat(3)), ["x"])
    other = start("a", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "o"},
                        {"role": "user", "content": "r"}])
    with pytest.raises(ResumeError, match="does not follow"):
        resume(records, starts(other))


def test_turns_after_an_end_are_an_error() -> None:
    fresh = start("a", chat(2))
    _, records = journaled(fresh, ["x", "y"])
    extra = {**records[1], "turn": 2, "parent": records[1]["digest"], "digest": "f" * 32}
    with pytest.raises(ResumeError, match="after the conversation ended"):
        resume([*records, extra], starts(fresh))


def test_a_journal_that_paired_a_command_the_dataset_never_ran_is_not_continued() -> None:
    # Written before one-line fences were read: the observation followed the target's own
    # command. Replayed under today's pairing the chain ends there; its later turns are refused.
    agent = [{"role": "user", "content": "Answer with Act: bash or Act: finish."},
             {"role": "assistant", "content": "OK."},
             {"role": "user", "content": "Task: count."},
             {"role": "assistant", "content": "Think: list files.\n\nAct: bash"},
             {"role": "user", "content": "The output of the OS: a.txt"},
             {"role": "assistant", "content": "Act: finish"}]
    fresh = start("os", agent, "agent_action")
    ended, records = journaled(fresh, ["OK.", "Act: bash\n\n```ls /etc | wc -l```"])
    assert ended.end.reason == ConversationEnd.TOOL_CALL_DIVERGED
    later = {**records[1], "turn": 2, "parent": records[1]["digest"], "inputs": [4, 5],
             "next_index": 6, "text": "Act: finish", "end": {"reason": "completed"},
             "digest": chain.turn_digest(records[1]["digest"], (4, 5), "Act: finish")}
    with pytest.raises(ResumeError, match="ls /etc.*force_regenerate"):
        resume([*records, later], starts(fresh))


def test_other_records_and_conversations_are_left_alone() -> None:
    fresh = start("a", chat(2))
    _, records = journaled(start("z", chat(2)), ["x"])
    prompt_record = {"id": "p1", "status": "completed", "text": "single-turn"}
    assert resume([*records, prompt_record], starts(fresh)) == {"a": fresh}


def test_a_turn_record_needs_a_turn() -> None:
    with pytest.raises(ValueError, match="no turn"):
        turn_record(start("a", chat(1)))
