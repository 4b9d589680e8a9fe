"""Mixed sampling: variants crossed by seed, the same on every try, counted as rendered."""

from __future__ import annotations

import collections

import pytest
from pydantic import ValidationError

from include.engine.variants import count_by_thinking, sampling_for, variant_of
from include.settings.fields import SamplingVariants

MIX = {"temperature": [0.6, 1.0], "enable_thinking": [True, False]}
BASE = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "enable_thinking": True}


def test_each_prompt_gets_the_same_variant_on_every_try_and_another_seed_reshuffles() -> None:
    ids = [f"src:default:{i}" for i in range(2000)]
    first = [variant_of(i, 7, MIX) for i in ids]
    assert first == [variant_of(i, 7, MIX) for i in ids]
    other = [variant_of(i, 8, MIX) for i in ids]
    assert sum(a != b for a, b in zip(first, other, strict=True)) > 1000


def test_settings_are_crossed_not_zipped() -> None:
    got = collections.Counter(tuple(sorted(variant_of(f"p{i}", 0, MIX).items()))
                              for i in range(4000))
    # Every combination occurs about equally often: zipping would give only two.
    assert len(got) == 4 and min(got.values()) > 850


def test_the_request_sampling_carries_the_variant_and_its_name() -> None:
    s = sampling_for("p1", BASE, MIX, 0)
    assert s["variant"] == f"temperature={s['temperature']},enable_thinking=" + (
        "true" if s["enable_thinking"] else "false")
    assert s["top_p"] == 0.95 and s["top_k"] == 20  # not listed: the run's values
    assert sampling_for("p1", BASE, {}, 0) == BASE


def test_thinking_variants_are_counted_with_their_own_template_rendering() -> None:
    calls = []

    def count(convs, enable_thinking=True):
        calls.append(enable_thinking)
        return [len(c) + (0 if enable_thinking else 4) for c in convs]

    convs = [["a"], ["b", "c"], ["d"]]
    assert count_by_thinking(count, convs, [True, False, None], True) == [1, 6, 1]
    assert sorted(calls, key=str) == [False, True]
    calls.clear()
    assert count_by_thinking(count, convs, [None] * 3, True) == [1, 2, 1] and calls == [True]


@pytest.mark.parametrize(("value", "fragment"), [
    ({"min_p": [0.1]}, "min_p"), ({"temperature": []}, "at least 1 item"),
    ({"top_k": [20, 20]}, "twice"), ({"top_p": 0.9}, "valid list")])
def test_bad_variants_are_refused_by_the_settings_naming_the_setting(value, fragment) -> None:
    # The run settings' own model is the one check (check_settings and the trigger form).
    with pytest.raises(ValidationError, match=fragment):
        SamplingVariants(**value)
    assert SamplingVariants(**MIX).mapping() == MIX
