"""Whole-conversation rows: exact, and only where the turns are prefix-stable."""

from __future__ import annotations

from typing import Any

import pytest

from include.conversations import chain
from include.conversations.chain import ConversationEnd, start
from include.conversations.rows import Stability, prefix_stability, whole_row
from tests.unit.conversations.dialogues import chat, drive

#: Plain ChatML: the history as it was sampled.
KEEPS_HISTORY = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
#: Qwen3's rule, on ChatML: an assistant turn before the last user turn is
#: rendered without its reasoning (its text after ``</think>``), the last one as sampled.
DROPS_REASONING = (
    "{%- set ns = namespace(last=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- set content = m.content -%}"
    "{%- if m.role == 'assistant' and loop.index0 < ns.last and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


class TokenizerServer:
    """Renders as SGLang does (template, then encode) and samples ``text`` + <|im_end|>."""

    def __init__(self, tokenizer: Any, template: str | None = None) -> None:
        self.tok, self.template = tokenizer, template
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def __call__(self, messages: list[dict[str, str]], text: str) -> chain.TurnResult:
        rendered = self.tok.apply_chat_template(messages, tokenize=False,
                                                add_generation_prompt=True,
                                                chat_template=self.template)
        prompt = self.tok(rendered, add_special_tokens=False).input_ids
        sampled = self.tok(text, add_special_tokens=False).input_ids + [self.end]
        return chain.TurnResult(text, "stop", self.end, prompt, sampled,
                                {"prompt_tokens": len(prompt), "completion_tokens": len(sampled)},
                                "http://s")


def run(server: TokenizerServer, answers: list[str]) -> chain.ChainState:
    state = start("conv", chat(len(answers)))
    for text in answers:
        state = chain.after_turn(state, server(chain.next_request(state), text))
    return state


def conversation_row(state: chain.ChainState) -> tuple[list[int], list[int]] | Stability:
    """The whole row of a chain's turns as the tokenization stage builds it (server ids)."""
    return whole_row([(t.result.prompt_token_ids, t.result.response_token_ids)
                      for t in state.turns])


THINKING = [f"<think>\nstep {k} of the plan\n</think>\n\nanswer {k} with sql" for k in range(3)]


def test_a_prefix_stable_chain_is_one_row_trained_on_every_target_turn() -> None:
    state = drive(start("c", chat(3)), ["one two", "three", "four five six"])
    row = conversation_row(state)
    assert isinstance(row, tuple), row
    input_ids, loss_mask = row
    last = state.turns[-1].result
    assert input_ids == last.prompt_token_ids + last.response_token_ids
    trained = [t for t, m in zip(input_ids, loss_mask, strict=True) if m]
    assert trained == [i for t in state.turns for i in t.result.response_token_ids]
    assert sum(loss_mask) == sum(len(t.result.response_token_ids) for t in state.turns)


def test_a_template_keeping_the_sampled_history_is_prefix_stable_with_thinking(
    standin_tokenizer: Any,
) -> None:
    state = run(TokenizerServer(standin_tokenizer, KEEPS_HISTORY), THINKING)
    row = conversation_row(state)
    assert isinstance(row, tuple), row
    assert row[0][-1] == standin_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert sum(row[1]) == sum(len(t.result.response_token_ids) for t in state.turns)


def test_the_standin_renders_like_qwen3_not_prefix_stable_with_thinking_only(
    standin_tokenizer: Any,
) -> None:
    thinking = conversation_row(run(TokenizerServer(standin_tokenizer), THINKING))
    assert isinstance(thinking, Stability) and thinking.turn == 1
    assert isinstance(conversation_row(run(TokenizerServer(standin_tokenizer),
                                           ["plain one", "plain two"])), tuple)


def test_a_template_that_drops_reasoning_is_not_prefix_stable_and_says_where(
    standin_tokenizer: Any,
) -> None:
    state = run(TokenizerServer(standin_tokenizer, DROPS_REASONING), THINKING)
    result = conversation_row(state)
    assert isinstance(result, Stability) and not result.stable
    first = state.turns[0].result
    # It differs exactly where turn 0's sampled <think> was: turn 1's prompt has the answer.
    assert (result.turn, result.position) == (1, len(first.prompt_token_ids))


def test_without_thinking_the_reasoning_dropping_template_is_stable(
    standin_tokenizer: Any,
) -> None:
    state = run(TokenizerServer(standin_tokenizer, DROPS_REASONING), ["plain one", "plain two"])
    assert isinstance(conversation_row(state), tuple)


@pytest.mark.parametrize(("turns", "expected"), [
    ([([1, 2], [3]), ([1, 2, 3, 4], [5])], Stability(True)),
    ([([1, 2], [3]), ([1, 2, 9, 4], [5])], (1, 2)),
    ([([1, 2], [3]), ([1, 2, 3, 4], [5]), ([1, 2, 3, 4, 6], [7])], (2, 4)),
    ([([1, 2], [3, 4]), ([1, 2, 3], [5])], (1, 3)),  # shorter than what came before
    ([([1], [2])], Stability(True)),
])
def test_prefix_stability_names_the_first_differing_turn_and_position(
    turns: list, expected: Stability | tuple[int, int],
) -> None:
    result = prefix_stability(turns)
    if isinstance(expected, Stability):
        assert result == expected
    else:
        assert (result.stable, result.turn, result.position) == (False, *expected)
        assert result.detail


def test_no_turns_no_conversation_row() -> None:
    result = conversation_row(chain.end_conversation(start("c", chat(1)), ConversationEnd.FAILED))
    assert isinstance(result, Stability) and not result.stable and result.turn is None
