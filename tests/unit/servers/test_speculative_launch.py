"""A launch's speculative flags, and the reuse check comparing /server_info's speculation."""

from __future__ import annotations

from include.servers.decisions import launch_step
from include.servers.expectations import ModelExpectation, SpeculativeLaunch
from include.servers.observations import ModelsProbe

MODELS = {"data": [{"id": "m", "max_model_len": 8192}]}
EXPECTED = ModelExpectation("m", 8192)
EAGLE = SpeculativeLaunch("EAGLE3", "/models/good", 3, 1, 4)
SPECULATING = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/good",
               "speculative_num_steps": 3, "speculative_eagle_topk": 1,
               "speculative_num_draft_tokens": 4}
PLAIN = {"speculative_algorithm": None}


def _step(expected: ModelExpectation, info: object) -> tuple[str, list[str]]:
    return launch_step(ModelsProbe(True, 200, MODELS), True, expected,
                       replace_mismatched=False, server_info=info)


def test_a_server_is_reused_only_with_the_same_speculation() -> None:
    drafter = ModelExpectation("m", 8192, speculative=EAGLE)
    assert _step(drafter, SPECULATING) == ("reuse", [])
    assert _step(EXPECTED, PLAIN) == ("reuse", [])
    step, why = _step(EXPECTED, SPECULATING)  # the main DAG never reuses a drafter's server
    assert step == "refuse" and "wants the target alone" in why[0]
    step, why = _step(drafter, PLAIN)
    assert step == "refuse" and "does not speculate" in why[0]
    step, why = _step(drafter, {**SPECULATING, "speculative_draft_model_path": "/models/poor"})
    assert step == "refuse" and "speculative_draft_model_path" in why[0]
    assert _step(drafter, None)[0] == "refuse"  # cannot tell: never taken for a drafter's


def test_the_flags_are_typed_words_and_survive_xcom() -> None:
    assert EAGLE.flags() == ["--speculative-algorithm", "EAGLE3",
                             "--speculative-draft-model-path", "/models/good",
                             "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                             "--speculative-num-draft-tokens", "4"]
    drafter = ModelExpectation("m", 8192, speculative=EAGLE)
    assert ModelExpectation.from_dict(drafter.to_dict()) == drafter
