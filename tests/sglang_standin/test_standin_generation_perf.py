"""Tests of the pure parts: deterministic completions and the batching performance model."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from sglang_standin import perf
from sglang_standin.generation import CompletionWriter, LengthModel, detokenize
from sglang_standin.words import WORDS

THINKING_PROMPT = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
PLAIN_PROMPT = THINKING_PROMPT + "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def writer(tokenizer: Any) -> CompletionWriter:
    return CompletionWriter(tokenizer, seed=7)


def test_completion_is_a_pure_function_of_seed_prompt_and_sampling(
    writer: CompletionWriter, tokenizer: Any
) -> None:
    a = writer.write(PLAIN_PROMPT, {"temperature": 0.6}, None)
    assert a == writer.write(PLAIN_PROMPT, {"temperature": 0.6}, None)
    assert a.ids != writer.write(PLAIN_PROMPT, {"temperature": 0.7}, None).ids
    assert a.ids != writer.write(PLAIN_PROMPT + " ", {"temperature": 0.6}, None).ids
    other_seed = CompletionWriter(tokenizer, seed=8)
    assert a.ids != other_seed.write(PLAIN_PROMPT, {"temperature": 0.6}, None).ids


def test_token_count_matches_the_tokenizer_and_caps_cut_a_prefix(
    writer: CompletionWriter, tokenizer: Any
) -> None:
    for i in range(60):
        prompt = f"<|im_start|>user\nquestion {i}<|im_end|>\n<|im_start|>assistant\n"
        full = writer.write(prompt, {}, None)
        assert full.finish == "stop" and full.ids[-1] == full.matched_stop == tokenizer.eos_token_id
        # The text re-encodes to exactly the generated ids (EOS is not in the text).
        assert tokenizer.encode(full.text, add_special_tokens=False) == full.ids[:-1]
        cap = max(1, len(full.ids) // 2)
        cut = writer.write(prompt, {}, cap)
        assert cut.finish == "length" and cut.matched_stop is None
        assert cut.ids == full.ids[:cap]
        roomy = writer.write(prompt, {}, len(full.ids))
        assert roomy.finish == "stop" and roomy.ids == full.ids


def test_lengths_are_long_tailed_around_the_median(tokenizer: Any) -> None:
    w = CompletionWriter(tokenizer, seed=1, lengths=LengthModel(median_tokens=300, sigma=0.9))
    lengths = [len(w.write(f"p{i}", {}, None).ids) for i in range(400)]
    assert 200 <= statistics.median(lengths) <= 450
    assert max(lengths) > 1500  # the tail reaches several times the median
    assert min(lengths) >= 3


def test_thinking_output_is_think_block_then_answer_then_eos(
    writer: CompletionWriter, tokenizer: Any
) -> None:
    out = writer.write(THINKING_PROMPT, {}, None)
    assert out.thinking and out.finish == "stop"
    raw = tokenizer.decode(out.ids, skip_special_tokens=False)
    assert raw.startswith("<think>\n") and raw.endswith(".<|im_end|>")
    reasoning, answer = raw.removeprefix("<think>").split("\n</think>\n\n")
    assert reasoning.startswith("\n") and "<think>" not in answer
    assert out.text == raw.removesuffix("<|im_end|>")
    assert not writer.write(PLAIN_PROMPT, {}, None).thinking


def test_detokenize_trims_only_the_matched_stop_and_honours_skip_special_tokens(
    tokenizer: Any,
) -> None:
    ids = tokenizer.encode("<|im_start|>Hi<think>x</think><|im_end|>", add_special_tokens=False)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert ids[-1] == eos
    assert detokenize(tokenizer, ids, eos) == "Hi<think>x</think>"
    assert detokenize(tokenizer, ids, eos, False) == "<|im_start|>Hi<think>x</think>"
    # No stop matched (finish_reason "length"): nothing is trimmed.
    assert detokenize(tokenizer, ids, None, False).endswith("</think><|im_end|>")
    assert detokenize(tokenizer, ids, None) == "Hi<think>x</think>"


def _check_noncanonical(tokenizer: Any, runs: int) -> None:
    canonical = CompletionWriter(tokenizer, seed=5)
    half = CompletionWriter(tokenizer, seed=5, noncanonical_rate=0.5)
    every = CompletionWriter(tokenizer, seed=5, noncanonical_rate=1.0)
    assert half.splits is not None and canonical.splits is None
    vocab_size = len(tokenizer.get_vocab())
    for row in half.splits:
        for split in row:
            assert split is None or (len(split) >= 2 and all(0 <= t < vocab_size for t in split))
    assert sum(s is not None for row in half.splits for s in row) > 0.9 * sum(map(len, half.splits))
    longer = 0
    for i in range(runs):
        prompt = f"<|im_start|>user\nq{i}<|im_end|>\n<|im_start|>assistant\n"
        base = canonical.write(prompt, {}, None)
        assert tokenizer.encode(base.text, add_special_tokens=False) == base.ids[:-1]
        for w in (half, every):
            out = w.write(prompt, {}, None)
            # The same text, spelled with other real tokens; the tokenizer gives it back
            # canonically, so re-tokenizing the text loses the sampled ids.
            assert out.text == base.text and out.finish == "stop"
            assert tokenizer.decode(out.ids[:-1]) == base.text
            assert tokenizer.encode(out.text, add_special_tokens=False) == base.ids[:-1]
            assert out.completion_tokens == len(out.ids)
            assert w.write(prompt, {}, None).ids == out.ids  # deterministic
            cap = len(out.ids) // 2
            assert w.write(prompt, {}, cap).ids == out.ids[:cap]
        assert len(every.write(prompt, {}, None).ids) >= len(out.ids) >= len(base.ids)
        longer += len(out.ids) > len(base.ids)
    assert longer == runs  # every completion of ~60 words has some split at rate 0.5


def test_noncanonical_splits_keep_the_text_and_change_the_ids(tokenizer: Any) -> None:
    _check_noncanonical(tokenizer, runs=30)


def test_noncanonical_splits_on_the_real_qwen3_6_vocabulary() -> None:
    from transformers import AutoTokenizer

    from sglang_standin.tokenizer import cached_chat_tokenizer

    qwen = AutoTokenizer.from_pretrained(cached_chat_tokenizer("qwen3_6"), local_files_only=True)
    w = CompletionWriter(qwen, noncanonical_rate=1.0)
    assert w.splits is not None
    canonical = qwen.encode(" model", add_special_tokens=False)
    split = w.splits[0][WORDS.index("model")]  # form 0 is " word"
    assert len(canonical) == 1 and split is not None and len(split) == 2
    assert qwen.decode(split) == " model" and split != canonical
    _check_noncanonical(qwen, runs=5)


def test_step_time_and_ceiling_follow_the_documented_formula() -> None:
    model = perf.PerfModel(
        decode_base_s=0.02,
        decode_per_req_s=0.001,
        prefill_per_token_s=1e-5,
        max_running_requests=50,
        time_scale=0.5,
    )
    assert model.step_seconds(10, 1000) == pytest.approx((0.02 + 0.01 + 0.01) * 0.5)
    assert perf.ceiling_gen_throughput(model) == pytest.approx(50 / ((0.02 + 0.05) * 0.5))
    assert model.gen_throughput(500) == perf.ceiling_gen_throughput(model)
    default = perf.PerfModel()
    assert 1000 < perf.ceiling_gen_throughput(default) < 2000


def test_throughput_rises_with_concurrency_up_to_the_ceiling() -> None:
    model = perf.PerfModel()
    jobs = [(500, 200 + (i * 37) % 300) for i in range(256)]
    rates = {}
    for in_flight in (4, 16, 64, 256):
        tokens, seconds = perf.simulate_closed_loop(model, in_flight, jobs)
        assert tokens == sum(out for _, out in jobs)
        rates[in_flight] = tokens / seconds
    assert rates[64] >= 3 * rates[4]
    assert rates[4] < rates[16] < rates[64]
    # Past max_running_requests more in flight only queues: no more than the ceiling.
    assert rates[256] <= perf.ceiling_gen_throughput(model) * 1.01
    assert rates[256] < rates[64] * 1.2


def test_kv_capacity_and_running_cap_make_requests_queue() -> None:
    model = perf.PerfModel(max_running_requests=3, max_total_num_tokens=1000)
    sched = perf.BatchScheduler(model)
    jobs = [perf.Job(300, 100) for _ in range(5)]  # 400 KV tokens each: only two fit
    for job in jobs:
        sched.submit(job)
    first = sched.step()
    assert first.admitted == jobs[:2] and len(sched.waiting) == 3 and sched.kv_used == 800
    assert first.prefill_tokens == 600
    while not jobs[0].finished_at:
        sched.step()
    assert jobs[0].generated == 100 and jobs[0].first_token_at == first.duration_s
    sched.step()
    assert jobs[2] in sched.running and jobs[3] in sched.running and jobs[4] in sched.waiting
    assert len(sched.running) == 2

    small = perf.BatchScheduler(perf.PerfModel(max_running_requests=3))
    for _ in range(5):
        small.submit(perf.Job(10, 10))
    small.step()
    assert len(small.running) == 3 and len(small.waiting) == 2


def test_queue_cap_and_cancel() -> None:
    sched = perf.BatchScheduler(perf.PerfModel(max_running_requests=1), max_queued_requests=2)
    a, b = perf.Job(10, 5), perf.Job(10, 5)
    sched.submit(a)
    sched.submit(b)
    with pytest.raises(perf.QueueFullError, match="The request queue is full."):
        sched.submit(perf.Job(10, 5))
    sched.step()  # a runs, b waits
    assert sched.cancel(a) and sched.kv_used == 0 and not sched.running
    assert sched.cancel(b) and sched.idle
    assert not sched.cancel(b)


def test_cached_prompt_tokens_skip_prefill() -> None:
    model = perf.PerfModel(prefill_per_token_s=1e-3, decode_base_s=0.01, decode_per_req_s=0.0)
    cold, warm = perf.BatchScheduler(model), perf.BatchScheduler(model)
    cold.submit(perf.Job(1000, 3))
    warm.submit(perf.Job(1000, 3, cached_tokens=900))
    first_cold, first_warm = cold.step(), warm.step()
    assert first_cold.prefill_tokens == 1000 and first_warm.prefill_tokens == 100
    assert first_cold.duration_s == pytest.approx(0.01 + 1.0)
    assert first_warm.duration_s == pytest.approx(0.01 + 0.1)
