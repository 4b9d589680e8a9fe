"""The dataset card says when a run mixed sampling and when it regenerated whole conversations."""

from __future__ import annotations

from include.reporting.card import _conversation_lines, _sampling_lines


def test_mixed_sampling_is_on_the_card_with_the_values_drawn() -> None:
    text = "\n".join(_sampling_lines({"temperature": 0.6, "turns": "all", "sampling_variants": {
        "temperature": [0.6, 1.0], "enable_thinking": [True, False]}}))
    assert "`temperature` [0.6, 1.0]" in text and "`enable_thinking` [True, False]" in text
    assert "sampling_variant" in text and "| turns | all |" in text
    assert "Mixed sampling" not in "\n".join(_sampling_lines({"temperature": 0.6}))


def test_whole_conversations_are_on_the_card_with_their_rows_and_ends() -> None:
    conv = {"conversations": 30, "turns": 35, "whole_rows": 2, "turn_rows": 31,
            "ends": {"completed": 28, "tool_call_diverged": 2, "failed": 0},
            "kept_apart": {"not_prefix_stable": 5, "one_turn": 23}}
    text = "\n".join(_conversation_lines(conv))
    assert "30 conversations" in text and "35 target turns" in text
    assert "completed 28, tool_call_diverged 2." in text and "failed" not in text
    assert "2 whole-conversation rows" in text and "31 per-turn rows" in text
    assert "not_prefix_stable 5" in text
    assert _conversation_lines(None) == []


def test_a_source_regenerated_whole_is_named_beside_the_runs_turns() -> None:
    settings = {"turns": "first", "sources": [{"name": "infinity_instruct", "turns": "all"},
                                              {"name": "metamathqa", "turns": None}]}
    text = "\n".join(_sampling_lines(settings))
    assert "| turns | first; all for infinity_instruct |" in text
    assert "| turns | all |" in "\n".join(_sampling_lines({"turns": "all", "sources": None}))
