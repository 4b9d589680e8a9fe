"""Conversation chains: requests turn by turn, every end reason, never an unanswered user."""

from __future__ import annotations

import pytest

from include.conversations import chain
from include.conversations.chain import ConversationEnd, End, after_turn, next_request, start
from tests.unit.conversations.dialogues import (
    IntServer,
    call,
    chat,
    drive,
    hermes_parallel,
)

PARALLEL = call("get_time", zone="JST") + call("get_weather", city="Paris")


@pytest.mark.parametrize("turns", [2, 3, 5, 8])
def test_a_chat_of_n_turns_is_n_requests_each_on_the_targets_own_history(turns: int) -> None:
    server = IntServer()
    answers = [f"<think>\nplan {k}\n</think>\n\nmy answer {k}" for k in range(turns)]
    state = drive(start("c1", chat(turns)), answers, server)
    assert state.end == End(ConversationEnd.COMPLETED)
    assert len(state.turns) == turns == len(server.sent)
    for k, sent in enumerate(server.sent):
        assert sent[0] == {"role": "system", "content": "You are a helpful assistant."}
        assert sent[-1] == {"role": "user", "content": f"question {k} about sql and loops"}
        # The target's own earlier answers, raw (thinking in), never the dataset's.
        assert [m["content"] for m in sent if m["role"] == "assistant"] == answers[:k]
    assert chain.history(state)[-1] == {"role": "assistant", "content": answers[-1]}
    assert next_request(state) == End(ConversationEnd.COMPLETED)


def test_each_request_extends_the_previous_one_exactly() -> None:
    server = IntServer()
    drive(start("c", chat(4)), ["a", "b", "c", "d"], server)
    for before, after in zip(server.sent, server.sent[1:], strict=False):
        assert after[: len(before)] == before
        assert after[len(before)]["role"] == "assistant"


def test_parallel_calls_that_match_bring_both_tool_results() -> None:
    server = IntServer()
    state = drive(start("h", hermes_parallel()), [PARALLEL, "Sunny, 09:30.", "That is all."],
                  server)
    assert state.end == End(ConversationEnd.COMPLETED)
    assert len(state.turns) == 3
    second = server.sent[1]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "tool"]
    assert second[2]["content"] == PARALLEL
    assert [m["role"] for m in server.sent[2]][-2:] == ["assistant", "user"]


def test_a_missing_call_ends_the_conversation_after_that_turn() -> None:
    state = drive(start("h", hermes_parallel()), [call("get_weather", city="Paris"), "unused"])
    assert state.end is not None and state.end.reason == ConversationEnd.TOOL_CALL_DIVERGED
    assert "turn 0" in state.end.detail
    assert len(state.turns) == 1
    assert chain.history(state)[-1]["role"] == "assistant"  # no tool result without its call


def test_a_call_where_the_dataset_has_a_user_turn_diverges() -> None:
    state = drive(start("c", chat(3)), [call("search", q="sql"), "unused"])
    assert (state.end.reason, len(state.turns)) == (ConversationEnd.TOOL_CALL_DIVERGED, 1)


def test_a_tool_result_after_an_original_turn_without_a_call_never_follows() -> None:
    # The sample Hermes rows have unreadable calls (``{}``); a result may not follow either.
    for original in ("I will check.", "<tool_call>{}</tool_call>"):
        messages = [{"role": "user", "content": "weather?"},
                    {"role": "assistant", "content": original},
                    {"role": "tool", "content": "sunny"},
                    {"role": "assistant", "content": "It is sunny."}]
        state = drive(start("t", messages), ["I will check.", "unused"])
        assert (state.end.reason, len(state.turns)) == (ConversationEnd.TOOL_CALL_DIVERGED, 1)


def test_a_call_on_the_last_turn_still_completes() -> None:
    # Nothing follows it, so nothing has to pair with it.
    state = drive(start("c", chat(2)), ["fine", call("search", q="x")])
    assert (state.end.reason, len(state.turns)) == (ConversationEnd.COMPLETED, 2)


def test_a_truncated_turn_ends_the_conversation_and_is_kept() -> None:
    server = IntServer()
    state = start("c", chat(3))
    state = after_turn(state, server.answer(next_request(state), "one"))
    state = after_turn(state, server.answer(next_request(state), "cut off", finish="length"))
    assert (state.end.reason, len(state.turns)) == (ConversationEnd.TRUNCATED, 2)
    assert state.turns[-1].result.finish_reason == "length"


def test_a_failed_first_turn_leaves_no_turns() -> None:
    state = chain.end_conversation(start("c", chat(3)), ConversationEnd.FAILED, "timeout x3")
    assert (state.end, state.turns, chain.history(state)) == (
        End(ConversationEnd.FAILED, "timeout x3"), (), [])


@pytest.mark.parametrize("result", [chain.TurnResult(None, "stop"),
                                    chain.TurnResult("partial", "abort")])
def test_an_unusable_first_answer_fails_the_conversation_with_no_turns(
    result: chain.TurnResult,
) -> None:
    state = after_turn(start("c", chat(2)), result)
    assert (state.end.reason, state.turns) == (ConversationEnd.FAILED, ())


def test_a_later_failure_ends_on_the_targets_last_turn() -> None:
    state = drive(start("c", chat(3)), ["one"])
    state = after_turn(state, chain.TurnResult(None, "abort"))
    assert state.end.reason == ConversationEnd.FAILED and len(state.turns) == 1
    assert chain.history(state)[-1] == {"role": "assistant", "content": "one"}


def test_context_exhausted_is_an_end_the_engine_gives() -> None:
    state = drive(start("c", chat(3)), ["one"])
    state = chain.end_conversation(state, ConversationEnd.CONTEXT_EXHAUSTED, "no room")
    assert next_request(state) == End(ConversationEnd.CONTEXT_EXHAUSTED, "no room")


def test_ended_conversations_take_no_more_turns_or_ends() -> None:
    state = drive(start("c", chat(1)), ["only"])
    with pytest.raises(ValueError, match="ended"):
        after_turn(state, IntServer().answer([], "again"))
    with pytest.raises(ValueError, match="ended already"):
        chain.end_conversation(state, ConversationEnd.FAILED)
    with pytest.raises(ValueError, match="unknown end reason"):
        chain.end_conversation(start("c", chat(1)), "bored")


def test_ends_are_counted_by_reason() -> None:
    states = [
        drive(start("a", chat(2)), ["x", "y"]),
        drive(start("b", chat(2)), ["x", "y"]),
        drive(start("c", hermes_parallel()), ["no call"]),
        chain.end_conversation(start("d", chat(2)), ConversationEnd.FAILED),
        drive(start("e", chat(2)), ["x"]),  # still running: not counted
    ]
    counts = chain.count_ends(states)
    assert counts == {ConversationEnd.COMPLETED: 2, ConversationEnd.TOOL_CALL_DIVERGED: 1,
                      ConversationEnd.FAILED: 1, ConversationEnd.TRUNCATED: 0,
                      ConversationEnd.CONTEXT_EXHAUSTED: 0}


def test_agent_observations_follow_only_the_same_action() -> None:
    agent = [
        {"role": "user", "content": "You operate a shell. Answer with Act: bash or Act: finish."},
        {"role": "assistant", "content": "OK."},
        {"role": "user", "content": "Task: count files."},
        {"role": "assistant", "content": "Act: bash\n```bash\nls | wc -l\n```"},
        {"role": "user", "content": "The output of the OS: 3"},
        {"role": "assistant", "content": "Act: finish"},
    ]
    same = drive(start("a", agent, "agent_action"),
                 ["Sure.", "Think: count.\nAct: bash\n```bash\nls | wc -l\n```", "Act: finish"])
    assert (same.end.reason, len(same.turns)) == (ConversationEnd.COMPLETED, 3)
    other = drive(start("a", agent, "agent_action"), ["Sure.", "Act: bash\n```bash\nls\n```"])
    assert (other.end.reason, len(other.turns)) == (ConversationEnd.TOOL_CALL_DIVERGED, 2)


def test_a_one_line_fenced_command_is_not_followed_by_the_datasets_observation() -> None:
    # Shaped like the bundled AgentInstruct os sample: its action carries no command.
    agent = [
        {"role": "user", "content": "You are an assistant operating a shell. Answer with "
                                    "Act: bash or Act: finish."},
        {"role": "assistant", "content": "OK."},
        {"role": "user", "content": "Task: count the files in /etc."},
        {"role": "assistant", "content": "Think: list files.\n\nAct: bash"},
        {"role": "user", "content": "The output of the OS: a.txt"},
        {"role": "assistant", "content": "Act: finish"},
    ]
    server = IntServer()
    state = drive(start("os", agent, "agent_action"),
                  ["OK.", "Act: bash\n\n```ls /etc | wc -l```", "Act: finish"], server)
    assert (state.end.reason, len(state.turns)) == (ConversationEnd.TOOL_CALL_DIVERGED, 2)
    assert "ls /etc | wc -l" in state.end.detail
    assert not any(m["content"].startswith("The output of the OS") for sent in server.sent
                   for m in sent)


def test_the_ends_the_run_reports_are_the_ends_of_what_was_sent() -> None:
    # The engine's side (generation.conversing) drives the chain, the tokenization stage
    # counts the final records' ends for the report: both must say what the server received.
    from include.engine.conversing import Conversations
    from include.sglang.length import BudgetRule
    from include.tokenization.conversations import explode

    def agent(i: int) -> dict:
        return {"id": f"os:{i}", "source": "agentinstruct", "turns": "all",
                "call_format": "agent_action",
                "messages": [{"role": "user", "content": "Answer with Act: bash or Act: finish."},
                             {"role": "assistant", "content": "OK."},
                             {"role": "user", "content": f"Task: {i}"},
                             {"role": "assistant", "content": "Think: list files.\n\nAct: bash"},
                             {"role": "user", "content": "The output of the OS: a.txt"},
                             {"role": "assistant", "content": "Act: finish"}]}

    prompts = [agent(i) for i in range(4)]
    engine = Conversations(lambda ms: 10)
    engine.resume("shard-00000", prompts, [])
    server = IntServer()
    for p in prompts:  # conversation 0 runs a command the dataset's action does not
        task = ("Act: bash\n\n```ls /etc | wc -l```" if p["id"] == "os:0"
                else "Think: look.\n\nAct: bash")
        for text in ["OK.", task, "Act: finish"]:
            planned = engine.plan(p["id"], BudgetRule(4096, 256, 16, 16))
            if not isinstance(planned, tuple):
                break
            engine.turn_done(p["id"], server.answer(planned[0], text), server.url, {})
    observed = [sent[-1]["content"].startswith("The output of the OS") for sent in server.sent]
    assert sum(observed) == 3  # no observation after the command the target ran itself
    _, found = explode([engine.final_record(p) for p in prompts])
    as_sent = {ConversationEnd.COMPLETED: 3, ConversationEnd.TOOL_CALL_DIVERGED: 1}
    assert {k: v for k, v in engine.summary()["ends"].items() if v} == as_sent
    assert dict(found.ends) == as_sent


def test_consecutive_dataset_turns_are_sent_together() -> None:
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                {"role": "assistant", "content": "x"}, {"role": "assistant", "content": "y"},
                {"role": "user", "content": "c"}]
    state = start("c", messages)
    assert next_request(state) == messages[:2]
    state = drive(state, ["one"])
    assert next_request(state) == [*messages[:2], {"role": "assistant", "content": "one"},
                                   messages[4]]
    assert chain.new_messages(state) == [messages[4]]


def test_trailing_original_turns_after_the_last_user_are_not_answered() -> None:
    state = drive(start("c", [*chat(1), {"role": "system", "content": "bye"}]), ["one", "two"])
    assert (state.end.reason, len(state.turns)) == (ConversationEnd.COMPLETED, 1)


@pytest.mark.parametrize("messages", [
    [{"role": "assistant", "content": "hi"}],
    [{"role": "user", "content": 3}],
    [{"role": "gpt", "content": "x"}, {"role": "user", "content": "u"}],
])
def test_start_refuses_what_is_not_a_mapped_conversation(messages: list) -> None:
    with pytest.raises(ValueError, match="bad"):
        start("bad", messages)


def test_start_refuses_an_unknown_call_format() -> None:
    with pytest.raises(ValueError, match="unknown call format"):
        start("c", chat(1), "xml")
