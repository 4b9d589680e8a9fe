"""The generate task's start: prompts that surely fit go out before the tokenizer loads."""

from __future__ import annotations

import collections
import json

import pytest

from include.durability.journal import FileJournal
from include.engine.config import EngineConfig
from include.engine.planning import Planner
from include.engine.startup import PromptCounter, take_sure_fits, template_bytes
from include.engine.tally import Tally
from include.sglang.length import BudgetRule
from include.target_tokenizer import TokenizerError, count_prompt_tokens, load_tokenizer
from sglang_standin.tokenizer import build_chat_tokenizer


def _prompt(i: int, words: int = 3, **extra) -> dict:
    return {"id": f"p{i}", "messages": [{"role": "user", "content": "word " * words}], **extra}


class _Loading:
    """A counter whose tokenizer is still loading: it bounds; a count (what a real one waits
    for the tokenizer to give) is recorded."""

    def __init__(self, template: int = 100) -> None:
        self.template = template
        self.counted: list[int] = []

    def ready(self) -> bool:
        return False

    def upper_bound(self, messages) -> int:
        return self.template * (len(messages) + 1) + 2 * len(json.dumps(messages))

    def __call__(self, convs, enable_thinking=None):
        self.counted.append(len(convs))
        return [1000] * len(convs)


RULE = BudgetRule(context_length=4096, cap=512, margin=16, min_completion=8)


def _planner(tmp_path, prompts, counter) -> Planner:
    config = EngineConfig(model="m", context_length=4096, max_tokens=512, context_margin=16,
                          min_completion_tokens=8, sampling={"temperature": 0, "top_p": 1})
    tally = Tally("shard-00000", FileJournal(tmp_path / "j.jsonl"), config.sampling)
    planner = Planner(config, counter, tally, collections.deque(), None)
    planner.unplanned.extend(prompts)
    return planner


def test_prompts_that_surely_fit_are_planned_with_the_cap_before_the_tokenizer_is_ready(
        tmp_path) -> None:
    # p3 is long enough that its bound leaves less than the cap: it waits for its count.
    prompts = [_prompt(0), _prompt(1), _prompt(2), _prompt(3, words=600), _prompt(4)]
    counter = _Loading()
    planner = _planner(tmp_path, prompts, counter)
    planner.plan_more()
    assert [(i.record["id"], i.max_tokens) for i in planner.pending] == [
        ("p0", 512), ("p1", 512), ("p2", 512)]
    assert [p["id"] for p in planner.unplanned] == ["p3", "p4"] and counter.counted == []
    planner.plan_more()  # the front needs its count: the next chunk waits for the tokenizer
    assert counter.counted == [2] and not planner.unplanned
    assert [(i.record["id"], i.prompt_tokens) for i in planner.pending][3:] == [
        ("p3", 1000), ("p4", 1000)]


def test_whole_conversations_wait_for_the_tokenizer(tmp_path) -> None:
    planner = _planner(tmp_path, [_prompt(0, turns="all"), _prompt(1)], _Loading())
    assert take_sure_fits(planner.unplanned, planner.count_tokens, RULE, 256) == []


def test_a_plain_counting_function_plans_as_before(tmp_path) -> None:
    planner = _planner(tmp_path, [_prompt(0), _prompt(1)], lambda convs: [7] * len(convs))
    assert take_sure_fits(planner.unplanned, planner.count_tokens, RULE, 256) == []
    planner.plan_more()
    assert [(i.prompt_tokens, i.max_tokens) for i in planner.pending] == [(7, 512), (7, 512)]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return build_chat_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")


def test_the_bound_is_never_below_the_count_and_gives_the_exact_budget(tokenizer_dir) -> None:
    counter = PromptCounter(str(tokenizer_dir), True)
    tok = load_tokenizer(str(tokenizer_dir))
    convs = [
        [{"role": "user", "content": "x"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "why " * 300}],
        [{"role": "user", "content": "é ü 数学 🙂 " * 80}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b " * 50},
         {"role": "user", "content": "c\n\n" * 40}],
    ]
    exact = count_prompt_tokens(tok, convs, True)
    assert counter(convs) == exact
    assert counter(convs, enable_thinking=False) == count_prompt_tokens(tok, convs, False)
    for conv, p in zip(convs, exact, strict=True):
        for thinking in (True, False):
            assert counter.upper_bound(conv) >= count_prompt_tokens(tok, [conv], thinking)[0]
        bound = counter.upper_bound(conv)
        for context in (4096, 8192, 32768):
            if context - bound - 16 >= 1024:  # what take_sure_fits requires
                assert BudgetRule(context, 1024, 16, 8).budget(p).max_tokens == 1024


def test_a_tokenizer_that_cannot_load_fails_where_it_is_counted(tmp_path) -> None:
    counter = PromptCounter(str(tmp_path / "missing"), True)
    assert counter.upper_bound([{"role": "user", "content": "x"}]) is None
    with pytest.raises(TokenizerError, match="tokenizer_path"):
        counter([[{"role": "user", "content": "x"}]])
    assert counter.ready()


def test_template_size_from_either_file(tmp_path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "abc"}))
    assert template_bytes(str(tmp_path)) == 3
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "default", "template": "ab"},
                           {"name": "tool_use", "template": "cde"}]}))
    assert template_bytes(str(tmp_path)) == 5
    (tmp_path / "chat_template.jinja").write_text("{{ x }}")
    assert template_bytes(str(tmp_path)) == 7
    assert template_bytes(str(tmp_path / "nowhere")) is None
    assert take_sure_fits(collections.deque(), _Loading(), RULE, 8) == []
