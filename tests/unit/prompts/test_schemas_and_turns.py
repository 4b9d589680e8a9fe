"""Kinds are recognised from their columns; turns become prompts under each policy."""

from __future__ import annotations

import json

import pytest

from include.prompts.schemas import (
    KINDS,
    MalformedRow,
    RawTurn,
    UnknownLayoutError,
    check_kind,
    detect_kind,
)
from include.prompts.turns import DropRow, dedupe_key, normalized_text, to_messages
from synthetic_sources import GENERATORS, rows


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_each_published_layout_is_recognised_from_its_columns(kind: str) -> None:
    row = next(rows(kind, 1))
    assert detect_kind("s", list(row), row).name == kind


def test_unknown_layout_names_the_columns_found_and_expected() -> None:
    with pytest.raises(UnknownLayoutError) as err:
        detect_kind("mystery", ["prompt", "completion"], {"prompt": "x", "completion": "y"})
    text = str(err.value)
    assert "'mystery'" in text and "['completion', 'prompt']" in text
    assert "metamathqa: ['query', 'response', 'type']" in text


def test_named_kind_missing_columns_is_refused() -> None:
    with pytest.raises(UnknownLayoutError, match=r"lacks \['response', 'type'\]"):
        check_kind("m", KINDS["metamathqa"], ["query"])


def test_orca_messages_json_string_is_parsed_and_bad_json_is_malformed() -> None:
    turns = KINDS["orca_agentinstruct"].turns(
        {"messages": json.dumps([{"role": "user", "content": "hi"}])}
    )
    assert turns == [RawTurn("user", "hi")]
    with pytest.raises(MalformedRow, match="not valid JSON"):
        KINDS["orca_agentinstruct"].turns({"messages": "[{"})


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"query": None}, "missing or null"),
        ({"query": 7}, "holds int"),
        ({}, "missing or null"),
    ],
)
def test_flat_rows_with_missing_or_non_string_fields_are_malformed(row, message) -> None:
    with pytest.raises(MalformedRow, match=message):
        KINDS["metamathqa"].turns(row)


def test_hermes_tools_null_and_empty_are_zero_tools_and_garbage_is_flagged() -> None:
    meta = KINDS["hermes_function_calling"].extra_metadata
    assert meta({"tools": "null"}) == {"tools_count": 0}
    assert meta({"tools": "[]"}) == {"tools_count": 0}
    assert meta({"tools": '[{"a": 1}]'}) == {"tools_count": 1}
    assert meta({"tools": "[{"})["tools_unparsable"] is True


HERMES = [
    RawTurn("system", "<tools>[...]</tools>"),
    RawTurn("human", "call it"),
    RawTurn("gpt", "<tool_call>"),
    RawTurn("tool", "result"),
    RawTurn("human", "thanks"),
    RawTurn("gpt", "ok"),
]


def test_first_user_keeps_system_verbatim_and_cuts_before_first_assistant() -> None:
    assert to_messages(HERMES, "first_user") == [
        {"role": "system", "content": "<tools>[...]</tools>"},
        {"role": "user", "content": "call it"},
    ]


def test_until_last_user_keeps_history_up_to_last_user_turn() -> None:
    msgs = to_messages(HERMES, "until_last_user")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "user"]


def test_until_first_trained_assistant_keeps_the_task_turn_of_agentinstruct() -> None:
    row = next(rows("agentinstruct", 1))
    msgs = to_messages(KINDS["agentinstruct"].turns(row), "until_first_trained_assistant")
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[-1]["content"].startswith("Task: ")


@pytest.mark.parametrize(
    ("turns", "reason"),
    [
        ([RawTurn("narrator", "x"), RawTurn("human", "y")], "unknown_role"),
        ([RawTurn("gpt", "hello")], "no_user_turn"),
        ([RawTurn("system", "s"), RawTurn("human", " \n\t")], "empty"),
        ([RawTurn("human", "bad \ud800 surrogate")], "malformed"),
    ],
)
def test_rows_without_a_usable_prompt_are_dropped_with_a_reason(turns, reason) -> None:
    with pytest.raises(DropRow) as err:
        to_messages(turns, "first_user")
    assert err.value.reason == reason


def test_mixed_role_names_map_to_chat_roles() -> None:
    msgs = to_messages([RawTurn("System", "s"), RawTurn("USER", "u")], "first_user")
    assert [m["role"] for m in msgs] == ["system", "user"]


def test_dedupe_key_folds_unicode_forms_and_whitespace_but_not_case_or_roles() -> None:
    a = [{"role": "user", "content": "Ｃａｆé  costs\u200b 3"}]
    b = [{"role": "user", "content": "Café costs 3 "}]
    assert normalized_text(a) == normalized_text(b)
    assert dedupe_key(a) == dedupe_key(b)
    assert dedupe_key(a) != dedupe_key([{"role": "user", "content": "café costs 3"}])
    with_system = [{"role": "system", "content": "x"}, *b]
    assert dedupe_key(with_system) != dedupe_key(b)
