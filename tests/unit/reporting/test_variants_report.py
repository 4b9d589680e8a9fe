"""The report breaks lengths and quality filters down by sampling variant."""

from __future__ import annotations

from include.reporting.collect import ShardFacts
from include.reporting.facts import Completion
from include.reporting.figures import variant_figures
from include.reporting.render import variant_blocks

HOT, COLD = "temperature=1.0", "temperature=0.6"


def _comp(pid: str, variant: str, completion: int, finish: str = "stop") -> Completion:
    return Completion("s", finish, 10, completion, "http://a", "m", 1.0, 0.5, 1,
                      prompt_id=pid, variant=variant)


def test_lengths_truncations_and_filters_are_counted_per_variant() -> None:
    shard = ShardFacts("shard-00000", False)
    shard.completions = [_comp("p0", HOT, 100), _comp("p1", HOT, 300, "length"),
                         _comp("p2", COLD, 50), _comp("c3", COLD, 80)]
    shard.tokenized = {"quarantined": [
        {"id": "p1", "reason": "degenerate_repetition"},
        {"id": "c3#turn-1", "reason": "empty_answer"},     # a turn counts for its conversation
        {"id": "p2", "reason": "decode_mismatch"}]}         # a check, not a quality filter
    got = variant_figures([shard])
    assert got is not None and set(got) == {HOT, COLD}
    assert got[HOT]["completed"] == 2 and got[HOT]["truncated"] == 1
    assert got[HOT]["completion_tokens"]["mean"] == 200
    assert got[HOT]["filtered"] == {"degenerate_repetition": 1}
    assert got[COLD]["filtered"] == {"empty_answer": 1}
    table = variant_blocks(got)[1][1]
    assert [row[0] for row in table[1]] == [COLD, HOT]


def test_a_run_with_one_sampling_has_no_variant_section() -> None:
    shard = ShardFacts("shard-00000", False)
    shard.completions = [_comp("p0", "", 100)]
    assert variant_figures([shard]) is None
