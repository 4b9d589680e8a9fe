"""The output quality filters: each on planted failures and on clean rows that look like them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from include.quality import QUALITY_FILTERS, QualityOptions, filter_records
from include.quality.repetition import tail_loop

PROSE = (
    "The capital of France is Paris, a city on the Seine known for its museums, its food "
    "and its long history as a centre of art and science. Many visitors arrive by train; "
    "others by air, landing at one of the two large airports north and south of the city. "
)


def rec(text: str, i: int = 0, *, finish: str = "stop", thinking: bool = True,
        prompt: str | None = None) -> dict[str, Any]:
    """Return a completion record as the engine writes it (only what the filters read)."""
    return {
        "id": f"src:default:{i}", "source": "src", "status": "completed", "text": text,
        "finish_reason": finish, "sampling": {"enable_thinking": thinking},
        "messages": [{"role": "user", "content": prompt or f"question number {i}"}],
    }


def thought(answer: str, reasoning: str = "Let me think about the question first.") -> str:
    return f"<think>\n{reasoning}\n</think>\n\n{answer}"


def reasons(records: list[dict[str, Any]], **options: Any) -> dict[str, str]:
    kept, quarantined = filter_records(records, QualityOptions(**options))
    assert len(kept) + len(quarantined) == len(records)  # nothing silently lost
    assert all(q["detail"] for q in quarantined)
    return {q["id"]: q["reason"] for q in quarantined}


# --- degenerate_repetition ---------------------------------------------------------------

@pytest.mark.parametrize("text", [
    thought(PROSE + "I need to check this again. " * 60),  # a sentence loop at the end
    thought(PROSE) + " and then" + " the answer is the answer is" * 120,  # cut mid-span
    PROSE + "!" * 2000,  # a character loop
    PROSE + "数学" * 800,  # no spaces to split on
    PROSE + "\n" * 1500,  # white space only
    # A loop in the thinking that the model broke out of: repeated spans, not the tail.
    thought(PROSE, PROSE + "Wait, maybe the first step was wrong, so recheck it. " * 40),
])
def test_loops_are_quarantined(text: str) -> None:
    assert reasons([rec(text)], check_truncated=True) == {"src:default:0": "degenerate_repetition"}


def _code() -> str:
    tests = "\n".join(f"    assert add({i}, {i + 1}) == {2 * i + 1}" for i in range(60))
    return f"```python\ndef test_add():\n{tests}\n" + '    print("-" * 40)\n' * 8 + "```"


def _table() -> str:
    rows = "\n".join(f"| {i} | 0 | 0 | {i * i} |" for i in range(60))
    return "| n | a | b | n^2 |\n|---|---|---|---|\n" + rows


def _truth_table() -> str:
    rows = "\n".join("| " + " | ".join("T" if (i >> b) & 1 else "F" for b in range(4)) + " |"
                     for i in range(16))
    return "| p | q | r | s |\n|---|---|---|---|\n" + rows


@pytest.mark.parametrize("answer", [
    _code(),
    _table(),
    _truth_table(),
    r"$$\begin{pmatrix}" + "\n" + ("0 & " * 11 + r"0 \\" + "\n") * 12 + r"\end{pmatrix}$$",
    "$$" + " + ".join(["x"] * 40) + " = 40x$$",
    "\n".join(f"- Step {i}: check item {i} and write it down." for i in range(40)),
    "-" * 80 + "\n" + PROSE + "\n" + "=" * 80,
    PROSE * 3,  # a paragraph said three times is repetitive, not a loop
])
def test_legitimate_repetition_is_kept(answer: str) -> None:
    assert reasons([rec(thought(answer))]) == {}


def test_tail_loop_reports_the_shortest_period_and_what_it_covers() -> None:
    assert tail_loop("intro " + "abc" * 300, 6, 600, 800) == (3, 900)
    assert tail_loop("intro " + "abc" * 100, 6, 600, 800) is None  # 300 characters: too short
    assert tail_loop("x" * 5000, 6, 600, 800) == (1, 5000)


# --- unclosed_think, empty_answer -----------------------------------------------------------

def test_a_finished_turn_inside_its_thinking_is_unclosed() -> None:
    # As SGLang's qwen3 parser reads a thinking answer (the real server, tests/real_sglang):
    # thinking from the first token, <think> written or not; closed by </think> or, with none,
    # by a <tool_call>; with neither, all of it is thinking (reasoning_tokens = all).
    records = [rec("<think>\nStill thinking about it", 0),
               rec("No tag at all, never closed", 1),
               rec(thought("Paris."), 2),
               rec("Done.\n</think>\n\nParis.", 3),
               rec('Let me look.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', 4)]
    assert reasons(records) == {"src:default:0": "unclosed_think",
                                "src:default:1": "unclosed_think"}


def test_a_cut_thought_is_left_to_the_truncation_setting() -> None:
    cut = rec("<think>\nStill thinking about", finish="length")
    assert reasons([cut]) == {}
    assert reasons([cut], check_truncated=True) == {}  # cut, not unclosed


@pytest.mark.parametrize("text", [thought(""), thought("\n\n  \n"),
                                  "<think>\nshort\n</think>"])
def test_nothing_after_thinking_is_an_empty_answer(text: str) -> None:
    assert reasons([rec(text)]) == {"src:default:0": "empty_answer"}


def test_thinking_off_answers_and_empty_thought_blocks() -> None:
    records = [
        rec("Paris.", 0, thinking=False),  # the template's empty think block is in the prompt
        rec("   ", 1, thinking=False),  # nothing generated at all
        rec("<think>\n\n</think>\n\nParis.", 2),  # an empty thought, then an answer
        rec("<think>x</think>Paris", 3, thinking=False),  # left to template_mismatch
    ]
    assert reasons(records) == {"src:default:1": "empty_answer"}


# --- invalid_tool_call_json -------------------------------------------------------------------

def call(body: Any) -> str:
    return f"<tool_call>\n{body if isinstance(body, str) else json.dumps(body)}\n</tool_call>"


GOOD = {"name": "get_weather", "arguments": {"city": "Paris"}}


@pytest.mark.parametrize("answer", [
    call(json.dumps(GOOD)[:-2]),
    call(json.dumps(GOOD).replace('"city"', "'city'")),
    call({"arguments": {"city": "Paris"}}),
    call({"name": "get_weather", "arguments": ["Paris"]}),
    call({"name": "get_weather", "arguments": "not json"}),
    call([GOOD]),
    call(GOOD) + "\n" + call("{}"),  # the second of two
    "<tool_call>\n" + json.dumps(GOOD),  # a finished turn that never closes its block
])
def test_broken_tool_calls_are_quarantined(answer: str) -> None:
    assert reasons([rec(thought(answer))]) == {"src:default:0": "invalid_tool_call_json"}


@pytest.mark.parametrize("answer", [
    call(GOOD),
    call(GOOD) + "\n" + call({"name": "search", "arguments": {}}),
    call({"name": "search", "arguments": json.dumps({"q": "x"})}),  # the OpenAI wire form
    "Use this format:\n```\n<tool_call>\n{name: ..., arguments: ...}\n</tool_call>\n```\nDone.",
    "No tools needed: Paris.",
])
def test_valid_tool_calls_and_examples_in_code_are_kept(answer: str) -> None:
    assert reasons([rec(thought(answer))]) == {}


def test_a_tool_call_only_in_the_thinking_is_not_judged() -> None:
    text = thought("Paris.", reasoning="Maybe <tool_call>{broken</tool_call> would help.")
    assert reasons([rec(text)]) == {}


# --- near_duplicate ---------------------------------------------------------------------------

TEMPLATE = ("I am sorry, but I cannot help with that request because it falls outside what "
            "I am able to assist with today; please consult a qualified professional or an "
            "official source, who will be able to give you accurate and complete guidance.")


def test_a_template_answer_to_different_prompts_keeps_only_the_first() -> None:
    varied = TEMPLATE.replace("today", "now")
    records = [rec(thought(PROSE), 0), rec(thought(TEMPLATE), 1), rec(thought(PROSE[::-1]), 2),
               rec(thought(varied), 3), rec(thought(TEMPLATE, "other thoughts"), 4)]
    kept, quarantined = filter_records(records, QualityOptions())
    assert [r["id"] for r in kept] == ["src:default:0", "src:default:1", "src:default:2"]
    assert [(q["id"], q["reason"]) for q in quarantined] == [
        ("src:default:3", "near_duplicate"), ("src:default:4", "near_duplicate")]
    assert "src:default:1" in quarantined[0]["detail"]
    # The same records give the same verdicts (a retried shard publishes the same bytes).
    assert filter_records(records, QualityOptions()) == (kept, quarantined)


def test_short_equal_answers_and_the_same_prompt_twice_are_kept() -> None:
    short = [rec(thought("The answer is 12."), i) for i in range(5)]
    same_prompt = [rec(thought(TEMPLATE), 10, prompt="same"),
                   rec(thought(TEMPLATE), 11, prompt="  same ")]
    assert reasons(short + same_prompt) == {}


def test_a_quarantined_record_is_not_the_first_of_a_group() -> None:
    looping = rec(thought(TEMPLATE + " again and again and again" * 200), 0)
    records = [looping, rec(thought(TEMPLATE), 1), rec(thought(TEMPLATE), 2)]
    assert reasons(records) == {"src:default:0": "degenerate_repetition",
                                "src:default:2": "near_duplicate"}


# --- switches and what is not judged -----------------------------------------------------------

PLANTED = {
    "degenerate_repetition": thought(PROSE + "I need to check this again. " * 60),
    "unclosed_think": "<think>\nStill thinking",
    "empty_answer": thought(""),
    "invalid_tool_call_json": thought(call("{not json")),
}


@pytest.mark.parametrize("name", QUALITY_FILTERS)
def test_each_filter_can_be_turned_off(name: str) -> None:
    records = [rec(text, i) for i, text in enumerate(PLANTED.values())]
    records += [rec(thought(TEMPLATE), 10), rec(thought(TEMPLATE), 11)]
    on = reasons(records)
    assert sorted(on.values()) == sorted(QUALITY_FILTERS)
    off = reasons(records, off=frozenset({name}))
    assert name not in off.values()
    assert set(on) - set(off) == {i for i, r in on.items() if r == name}


def test_unknown_filter_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown quality filters"):
        QualityOptions(off=frozenset({"loops"}))


def test_records_the_checks_own_are_passed_through() -> None:
    records = [
        {"id": "a", "finish_reason": "stop"},  # no text: no_raw_text
        rec("<think>\nx", 1, finish="abort"),  # unexpected_finish_reason
        rec(PROSE + "again " * 600, 2, finish="length"),  # dropped as truncated anyway
    ]
    kept, quarantined = filter_records(records)
    assert kept == records and quarantined == []
    assert reasons([records[2]], check_truncated=True) == {"src:default:2": "degenerate_repetition"}


def test_the_word_pair_bound_never_skips_a_text_the_full_count_flags() -> None:
    # degenerate_repetition counts n-grams only where repeated word pairs allow the share:
    # the bound must hold for any text, down to a share exactly at the threshold.
    import random

    from include.quality.repetition import _may_repeat, ngram_repeats

    rng = random.Random(7)
    words = ["a", "bb", "the", "cat", "0", "|", "T", "ran", "x1", "dog"]
    checked = 0
    for _ in range(3000):
        text = " ".join(rng.choice(words[: rng.randint(1, len(words))])
                        for _ in range(rng.randint(12, 300)))
        if rng.random() < 0.4:
            text = " ".join(text.split()[:rng.randint(2, 30)] * rng.randint(1, 12))
        for n in (2, 3, 10):
            found = ngram_repeats(text, n, 1)
            for fraction in (0.05, 0.3, 0.6, found[0] if found else 0.3):
                if found is not None and found[0] >= fraction:
                    assert _may_repeat(text.split(), n, fraction), (text, n, fraction)
                    checked += 1
    assert checked > 1000
    twice = PROSE.split() * 2  # half of it repeats: word pairs bound it near 0.5
    assert not _may_repeat(PROSE.split(), 10, 0.3) and not _may_repeat(twice, 10, 0.6)
    assert _may_repeat(twice, 10, 0.4)
