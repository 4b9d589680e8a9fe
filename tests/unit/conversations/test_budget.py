"""Budget per turn: estimated from the previous turn's server counts; no room ends it."""

from __future__ import annotations

import dataclasses

from include.conversations import chain
from include.conversations.budget import next_prompt_tokens, turn_budget
from include.conversations.chain import ConversationEnd, start
from include.sglang.length import BudgetRule
from tests.unit.conversations.dialogues import IntServer, chat, count_tokens, drive

RULE = BudgetRule(context_length=200, cap=64, margin=16, min_completion=8)


def test_the_first_turn_is_counted_whole() -> None:
    state = start("c", chat(3))
    assert next_prompt_tokens(state, count_tokens) == count_tokens(chain.next_request(state))


def test_a_later_turn_is_the_previous_prompt_and_sampled_ids_plus_the_new_turns() -> None:
    server = IntServer()
    state = drive(start("c", chat(3)), ["a four word answer"], server)
    previous = state.turns[-1].result
    expected = (len(previous.prompt_token_ids) + len(previous.response_token_ids)
                + count_tokens(chain.new_messages(state)))
    assert next_prompt_tokens(state, count_tokens) == expected
    assert next_prompt_tokens(state, count_tokens, slack=2) == expected + 2
    # The server renders one id more: the new line after the sampled <|im_end|>, template
    # glue neither count sees; ``slack`` is there for it.
    assert len(server.prompt_ids(chain.next_request(state))) == expected + 1


def test_without_server_ids_the_usage_counts_stand_in() -> None:
    state = start("c", chat(2))
    state = chain.after_turn(state, chain.TurnResult(
        "x", "stop", usage={"prompt_tokens": 40, "completion_tokens": 7}))
    assert next_prompt_tokens(state, lambda m: 5) == 52


def test_the_budget_is_the_room_left_capped() -> None:
    state = start("c", chat(2))
    prompt = next_prompt_tokens(state, count_tokens)
    budget = turn_budget(state, count_tokens, dataclasses.replace(RULE, cap=1000))
    assert (budget.prompt_tokens, budget.max_tokens, budget.end_reason) == (
        prompt, 200 - prompt - 16, None)
    assert turn_budget(state, count_tokens, RULE).max_tokens == 64


def test_a_turn_that_cannot_fit_ends_the_conversation_as_context_exhausted() -> None:
    server = IntServer()
    state = drive(start("c", chat(4)), [" ".join(["word"] * 80)] * 2, server)
    budget = turn_budget(state, count_tokens, RULE)
    assert budget.end_reason == ConversationEnd.CONTEXT_EXHAUSTED
    assert budget.max_tokens == 0 and "turn 2" in budget.detail
    ended = chain.end_conversation(state, budget.end_reason, budget.detail)
    assert ended.end.reason == ConversationEnd.CONTEXT_EXHAUSTED and len(ended.turns) == 2
