"""Tool-call pairing: parallel, reordered, key order, string arguments, every divergence."""

from __future__ import annotations

import json

import pytest

from include.conversations.tools import (
    agent_actions,
    calls_of,
    pair_calls,
    tool_calls,
    unwrap_tool_response,
)
from tests.unit.conversations.dialogues import call

PARIS = call("get_weather", city="Paris", unit="C")
TOKYO = call("get_time", zone="JST")


def paired(original: str, regenerated: str, *, results: bool = True,
           fmt: str = "tool_call") -> bool:
    return pair_calls(original, regenerated, fmt, results_follow=results).paired


def test_parallel_calls_are_all_read_and_sorted() -> None:
    calls = tool_calls(PARIS + "\n" + TOKYO + "\n" + PARIS)
    assert calls.valid
    assert len(calls.calls) == 3
    assert sorted(json.loads(c)["name"] for c in calls.calls) == ["get_time", "get_weather",
                                                                  "get_weather"]
    assert calls.calls.count(tool_calls(PARIS).calls[0]) == 2
    assert list(calls.calls) == sorted(calls.calls)


def test_reordered_parallel_calls_pair() -> None:
    assert paired(PARIS + TOKYO, TOKYO + "\n\n" + PARIS)


def test_argument_key_order_and_whitespace_do_not_matter() -> None:
    original = '<tool_call>{"name": "f", "arguments": {"a": 1, "b": [1, 2]}}</tool_call>'
    ours = '<tool_call>\n{ "arguments": {"b": [1,2], "a": 1.0}, "name": "f" }\n</tool_call>'
    assert paired(original, ours)


def test_arguments_as_a_json_string_equal_the_object() -> None:
    original = '<tool_call>{"name": "f", "arguments": "{\\"x\\": \\"y\\"}"}</tool_call>'
    assert paired(original, '<tool_call>{"name": "f", "arguments": {"x": "y"}}</tool_call>')


def test_a_missing_parallel_call_diverges() -> None:
    result = pair_calls(PARIS + TOKYO, PARIS, "tool_call", results_follow=True)
    assert not result.paired
    assert "1 of the original's not made" in result.detail and "get_time" in result.detail


def test_a_repeated_call_is_not_the_same_as_one() -> None:
    assert not paired(PARIS + PARIS, PARIS)


@pytest.mark.parametrize(("ours", "why"), [
    (call("get_weather", city="Lyon", unit="C"), "calls differ"),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"</tool_call>',
     "cannot be read"),
    ("It is sunny in Paris.", "no call where"),
    ('<tool_call>{"name": "get_weather", "arguments": {}}', "cannot be read"),  # cut off
    ('<tool_call>{"arguments": {}}</tool_call>', "cannot be read"),  # no name
    ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "cannot be read"),
])
def test_divergent_turns_say_why(ours: str, why: str) -> None:
    result = pair_calls(PARIS, ours, "tool_call", results_follow=True)
    assert not result.paired
    assert why in result.detail


def test_a_call_where_the_original_made_none_diverges() -> None:
    result = pair_calls("Just text.", PARIS, "tool_call", results_follow=False)
    assert (result.paired, result.detail) == (False, "1 call(s) where the original made none")


def test_no_call_on_either_side_pairs_when_no_result_follows() -> None:
    assert paired("Some answer.", "Another answer.", results=False)


def test_a_tool_result_after_an_original_without_calls_never_pairs() -> None:
    result = pair_calls("no call", "no call either", "tool_call", results_follow=True)
    assert not result.paired and "made no call" in result.detail


def test_the_dataset_side_may_be_a_python_literal_but_the_target_must_write_json() -> None:
    hermes_v1 = "<tool_call>\n{'arguments': {'city': 'Paris', 'unit': 'C'}, " \
                "'name': 'get_weather'}\n</tool_call>"
    assert paired(hermes_v1, PARIS)
    assert not paired(PARIS, hermes_v1)


def test_an_unreadable_original_diverges() -> None:
    result = pair_calls("<tool_call>{}</tool_call>", "<tool_call>{}</tool_call>", "tool_call",
                        results_follow=True)
    assert not result.paired and "original turn's calls cannot be read" in result.detail


def test_calls_inside_the_thinking_block_do_not_count() -> None:
    assert tool_calls(f"<think>\nmaybe {TOKYO}?\n</think>\n\n{PARIS}").calls == \
        tool_calls(PARIS).calls
    assert tool_calls(f"<think>{PARIS}</think>\n\nNo call needed.").calls == ()


def test_agent_actions_pair_on_the_action_and_its_code() -> None:
    original = "Think: list files.\n\nAct: bash\n\n```bash\nls  -a\n```"
    assert agent_actions(original).calls == ('["bash", "ls -a"]',)
    assert paired(original, "Think: look.\nAct: bash\n```bash\nls -a\n```", fmt="agent_action")
    assert not paired(original, "Act: bash\n```bash\nls\n```", fmt="agent_action")
    assert not paired(original, "Act: finish", fmt="agent_action")
    assert paired("OK.", "Sure.", results=False, fmt="agent_action")


FENCE = "```"


@pytest.mark.parametrize("answer", [
    f"Act: bash\n\n{FENCE}ls /etc | wc -l{FENCE}",            # one line, as the issue saw
    f"Act: bash {FENCE}ls /etc | wc -l{FENCE}",                 # opened on the action line
    f"Act: bash\n{FENCE}bash\nls /etc |  wc -l\n{FENCE}",       # a language tag
    f"Act: bash\n{FENCE}\nls /etc | wc -l\n{FENCE}",             # no tag
    "Act: bash\n~~~sh\nls /etc | wc -l\n~~~",                   # tildes
    "Act: bash\n````\nls /etc | wc -l\n````",                  # a longer fence
    f"Act: bash\n{FENCE}ls /etc | wc -l\n{FENCE}",              # the command on the opener
    f"Act: bash\nRunning it:\n{FENCE}bash\nls /etc | wc -l{FENCE}",  # prose first, closed late
])
def test_every_fence_form_reads_the_same_command(answer: str) -> None:
    assert agent_actions(answer).calls == ('["bash", "ls /etc | wc -l"]',)
    original = f"Think: count.\n\nAct: bash\n\n{FENCE}bash\nls /etc | wc -l\n{FENCE}"
    assert paired(original, answer, results=False, fmt="agent_action")


def test_a_one_line_fenced_command_does_not_pair_with_an_action_without_one() -> None:
    # The bundled AgentInstruct sample acts with a bare "Act: bash": a target that ran a
    # command is not followed by the dataset's observation of no command.
    result = pair_calls("Think: list files.\n\nAct: bash",
                        f"Act: bash\n\n{FENCE}ls /etc | wc -l{FENCE}", "agent_action",
                        results_follow=False)
    assert not result.paired and "ls /etc | wc -l" in result.detail
    assert not paired(f"Act: bash\n{FENCE}bash\nls\n{FENCE}", f"Act: bash {FENCE}ls -a{FENCE}",
                      results=False, fmt="agent_action")


def test_an_unclosed_fence_is_unreadable_and_a_fenced_action_line_is_code() -> None:
    cut = agent_actions(f"Act: bash\n{FENCE}bash\nls /etc")
    assert not cut.valid and "not closed" in cut.error
    assert not paired("Act: bash", f"Act: bash\n{FENCE}bash\nls /etc", results=False,
                      fmt="agent_action")
    inside = agent_actions(f"Act: bash\n{FENCE}\nAct: finish\n{FENCE}\nAct: finish")
    assert inside.calls == ('["bash", "Act: finish"]', '["finish", ""]')


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown call format"):
        calls_of("x", "xml")


def test_one_enclosing_tool_response_is_unwrapped_and_nothing_else() -> None:
    assert unwrap_tool_response('<tool_response>\n{"a": 1}\n</tool_response>') == '{"a": 1}'
    combined = "<tool_response>1</tool_response>\n<tool_response>2</tool_response>"
    assert unwrap_tool_response(combined) == combined
    assert unwrap_tool_response('{"a": 1}') == '{"a": 1}'
