"""The tokenization stage: exact masks, every quarantine reason, length policies, outputs."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from include.storage import LocalStore, publish_generated_shard
from include.tokenization import (
    ChatTokenizer,
    TokenizeOptions,
    tokenize_completions,
    tokenize_shard,
)
from include.tokenization.stage import QUARANTINE_REASONS, length_stats


@pytest.fixture(scope="module")
def chat(hf_tokenizer: Any) -> ChatTokenizer:
    return ChatTokenizer(hf_tokenizer)


MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is two plus two, and why?"},
]


def record(
    tok: Any,
    i: int = 0,
    *,
    thinking: bool = True,
    content: str | None = "It is four, because two and two make four.",
    reasoning: str | None = "Two plus two.\nThat is four.",
    finish: str = "stop",
    source: str = "metamathqa",
    messages: list[dict[str, str]] | None = None,
    prompt_tokens: int | None = None,
) -> dict[str, Any]:
    """Return a completion record whose usage.prompt_tokens is what the server would count."""
    messages = messages or MESSAGES
    if prompt_tokens is None:
        prompt_tokens = len(
            tok.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=True, enable_thinking=thinking
            )["input_ids"]
        )
    return {
        "id": f"{source}:default:{i}",
        "source": source,
        "messages": messages,
        "status": "completed",
        "content": content,
        "reasoning_content": reasoning if thinking else None,
        "finish_reason": finish,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 9, "total_tokens": 0},
        "sampling": {"enable_thinking": thinking},
    }


def split(tok: Any, sample: Any) -> tuple[str, str]:
    """Return (unmasked text, masked text) decoded from the sample."""
    head = [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if not m]
    tail = [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
    assert sample.loss_mask == [0] * len(head) + [1] * len(tail)  # one contiguous masked span
    return tok.decode(head), tok.decode(tail)


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("include_reasoning", [True, False])
def test_masks_cover_exactly_the_regenerated_text(
    hf_tokenizer: Any, chat: ChatTokenizer, thinking: bool, include_reasoning: bool
) -> None:
    rec = record(hf_tokenizer, thinking=thinking)
    result = tokenize_completions(chat, [rec], TokenizeOptions(include_reasoning=include_reasoning))
    assert not result.quarantined and not result.dropped
    (sample,) = result.samples
    prompt = hf_tokenizer.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
    )
    head, tail = split(hf_tokenizer, sample)
    answer = rec["content"] + "<|im_end|>"
    if thinking and include_reasoning:
        assert (head, tail) == (
            prompt,
            "<think>\n" + rec["reasoning_content"] + "\n</think>\n\n" + answer,
        )
        assert "<think>" in sample.conversation[-1]["content"]
    elif thinking:  # the empty think block is template text, not regenerated: no loss on it
        assert (head, tail) == (prompt + "<think>\n\n</think>\n\n", answer)
        assert sample.conversation[-1]["content"] == rec["content"]
    else:
        assert prompt.endswith("<think>\n\n</think>\n\n") and (head, tail) == (prompt, answer)
    # The ids are what encoding the whole text at once gives (no token spans the boundary).
    full_text = hf_tokenizer.decode(sample.input_ids)
    assert hf_tokenizer(full_text, add_special_tokens=False)["input_ids"] == sample.input_ids
    assert sample.length == len(sample.input_ids) and sample.finish_reason == "stop"
    assert sample.conversation[:-1] == MESSAGES and sample.conversation[-1]["role"] == "assistant"


@pytest.mark.parametrize(
    "content",
    [" leading space", "  two spaces", "\tTab", "!bang", "123 digits", "é accent", "x", "中文答案"],
)
def test_ids_equal_a_whole_text_encode_for_awkward_starts(
    hf_tokenizer: Any, chat: ChatTokenizer, content: str
) -> None:
    recs = [
        record(hf_tokenizer, 0, thinking=False, content=content),
        record(hf_tokenizer, 1, thinking=True, content=content, reasoning=content),
    ]
    result = tokenize_completions(chat, recs)
    assert not result.quarantined
    for s in result.samples:
        text = hf_tokenizer.decode(s.input_ids)
        assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == s.input_ids


def test_every_quarantine_reason_is_counted_with_its_id(
    hf_tokenizer: Any, chat: ChatTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = record(hf_tokenizer, 0)
    bad = {
        "invalid_record": {**record(hf_tokenizer, 1), "usage": {}},
        "unexpected_finish_reason": record(hf_tokenizer, 2, finish="abort"),
        "template_mismatch": record(hf_tokenizer, 3, content="<think>x</think>answer"),
        "prompt_tokens_mismatch": record(hf_tokenizer, 4, prompt_tokens=7),
    }
    no_reasoning_when_off = record(hf_tokenizer, 6, thinking=False)
    no_reasoning_when_off["reasoning_content"] = "I thought anyway"
    result = tokenize_completions(chat, [good, *bad.values(), no_reasoning_when_off])
    reasons = {q["id"]: q["reason"] for q in result.quarantined}
    assert reasons == {rec["id"]: reason for reason, rec in bad.items()} | {
        no_reasoning_when_off["id"]: "template_mismatch"
    }
    assert [s.id for s in result.samples] == [good["id"]]
    counts = result.manifest()["counts"]
    assert counts["quarantined"]["template_mismatch"] == 2 and counts["written"] == 1
    assert all(q["detail"] for q in result.quarantined)

    # The remaining reasons need a broken tokenizer or template to happen at all.
    monkeypatch.setattr(ChatTokenizer, "decodes_to", lambda self, ids, text: False)
    result = tokenize_completions(chat, [good])
    assert [q["reason"] for q in result.quarantined] == ["decode_mismatch"]
    monkeypatch.undo()
    monkeypatch.setattr(ChatTokenizer, "render_prompt", lambda self, m, t: "")
    result = tokenize_completions(chat, [record(hf_tokenizer, 7, prompt_tokens=0)])
    assert [q["reason"] for q in result.quarantined] == ["mask_all_one"]
    monkeypatch.undo()
    # A template whose prompt ends in "\n" (no think block) and an answer led by "\n": the two
    # newlines merge into one token across the boundary.
    plain = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    monkeypatch.setattr(ChatTokenizer, "render_prompt", lambda self, m, t: plain)
    count = len(hf_tokenizer(plain, add_special_tokens=False)["input_ids"])
    led = record(hf_tokenizer, 9, thinking=False, content="\nled by newline", prompt_tokens=count)
    result = tokenize_completions(
        chat, [led, record(hf_tokenizer, 10, thinking=False, prompt_tokens=count)]
    )
    assert [q["reason"] for q in result.quarantined] == ["prompt_not_prefix"]
    assert [s.id for s in result.samples] == ["metamathqa:default:10"]
    monkeypatch.undo()
    cut_in_reasoning = record(hf_tokenizer, 8, content=None, finish="length")
    result = tokenize_completions(
        chat,
        [cut_in_reasoning],
        TokenizeOptions(include_reasoning=False, keep_truncated_completions=True),
    )
    assert [q["reason"] for q in result.quarantined] == ["mask_all_zero"]
    assert set(result.manifest()["counts"]["quarantined"]) == set(QUARANTINE_REASONS)


def test_truncated_completions_are_dropped_unless_kept(
    hf_tokenizer: Any, chat: ChatTokenizer
) -> None:
    cut_answer = record(hf_tokenizer, 0, content="It is fo", finish="length")
    cut_thought = record(hf_tokenizer, 1, content="", reasoning="Two plus", finish="length")
    dropped = tokenize_completions(chat, [cut_answer, cut_thought])
    assert dropped.samples == [] and dropped.manifest()["counts"]["dropped"] == {
        "truncated_completion": 2,
        "over_length": 0,
    }
    kept = tokenize_completions(
        chat, [cut_answer, cut_thought], TokenizeOptions(keep_truncated_completions=True)
    )
    tails = [split(hf_tokenizer, s)[1] for s in kept.samples]
    # Exactly what was generated: no closing tags that the model never wrote, no <|im_end|>.
    assert tails == [
        "<think>\nTwo plus two.\nThat is four.\n</think>\n\nIt is fo",
        "<think>\nTwo plus",
    ]
    assert [s.finish_reason for s in kept.samples] == ["length", "length"]


def test_over_length_drop_and_truncate_are_counted(hf_tokenizer: Any, chat: ChatTokenizer) -> None:
    short = record(hf_tokenizer, 0, content="Four.")
    long = record(hf_tokenizer, 1, content="four " * 200)
    limit = tokenize_completions(chat, [short]).samples[0].length + 5
    dropped = tokenize_completions(chat, [short, long], TokenizeOptions(max_sequence_length=limit))
    assert [s.id for s in dropped.samples] == [short["id"]]
    assert dropped.manifest()["counts"]["dropped"]["over_length"] == 1
    assert dropped.manifest()["dropped"][0]["id"] == long["id"]
    cut = tokenize_completions(
        chat, [short, long], TokenizeOptions(max_sequence_length=limit, over_length="truncate")
    )
    assert [s.length for s in cut.samples] == [limit - 5, limit]
    assert cut.manifest()["counts"]["truncated_to_max_length"] == 1
    assert cut.samples[1].loss_mask[-1] == 1
    tiny = tokenize_completions(
        chat, [long], TokenizeOptions(max_sequence_length=16, over_length="truncate")
    )  # the prompt alone is longer: nothing to learn from, dropped
    assert tiny.samples == [] and tiny.manifest()["counts"]["dropped"]["over_length"] == 1


def test_parquet_conversations_and_manifest(hf_tokenizer: Any, chat: ChatTokenizer) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    recs = [
        record(hf_tokenizer, i, source=("a", "b")[i % 2], content="word " * (i + 1))
        for i in range(6)
    ]
    result = tokenize_completions(chat, [*recs, record(hf_tokenizer, 9, prompt_tokens=1)])
    table = pq.read_table(io.BytesIO(result.to_parquet()))
    assert table.schema == pa.schema(
        [
            ("input_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("length", pa.int32()),
            ("source", pa.string()),
            ("id", pa.string()),
            ("finish_reason", pa.string()),
        ]
    )
    rows = table.to_pylist()
    assert [r["id"] for r in rows] == [r["id"] for r in recs]
    assert all(r["length"] == len(r["input_ids"]) == len(r["loss_mask"]) for r in rows)
    assert rows[2]["input_ids"] == result.samples[2].input_ids
    lines = result.conversations_jsonl().decode().splitlines()
    first = json.loads(lines[0])
    assert len(lines) == 6 and set(first) == {"id", "conversations"}
    assert all(set(turn) == {"role", "content"} for turn in first["conversations"])
    assert [t["role"] for t in first["conversations"]] == ["system", "user", "assistant"]
    manifest = result.manifest()
    counts = manifest["counts"]
    assert (
        counts["input"]
        == 7
        == counts["written"] + sum(counts["quarantined"].values()) + sum(counts["dropped"].values())
    )
    assert manifest["quarantined"] == [
        {
            "id": "metamathqa:default:9",
            "reason": "prompt_tokens_mismatch",
            "detail": manifest["quarantined"][0]["detail"],
        }
    ]
    assert set(manifest["length_stats"]) == {"a", "b"}
    assert set(manifest["length_stats"]["a"]) == {"count", "mean", "p50", "p90", "p99", "max"}
    assert length_stats([1, 2, 3, 4, 100]) == {
        "count": 5,
        "mean": 22.0,
        "p50": 3,
        "p90": 100,
        "p99": 100,
        "max": 100,
    }


def test_tokenize_shard_publishes_create_only(
    hf_tokenizer: Any, chat: ChatTokenizer, tmp_path
) -> None:
    store = LocalStore(tmp_path)
    lines = [json.dumps(record(hf_tokenizer, i)) for i in range(3)]
    publish_generated_shard(store, 0, ("\n".join(lines) + "\n").encode(), {"counts": {}})
    manifest = tokenize_shard(store, 0, chat)
    assert manifest["counts"]["written"] == 3
    assert store.list("tokenized") == [
        "tokenized/shard-00000.conversations.jsonl",
        "tokenized/shard-00000.manifest.json",
        "tokenized/shard-00000.parquet",
    ]
    assert json.loads(store.read("tokenized/shard-00000.manifest.json")) == manifest
    assert tokenize_shard(store, 0, chat) == manifest  # a retry rewrites nothing


def test_a_template_of_another_layout_is_refused(hf_tokenizer: Any) -> None:
    import copy

    from include.tokenization import TokenizerError

    other = copy.deepcopy(hf_tokenizer)
    other.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(TokenizerError, match="renders an assistant turn differently"):
        ChatTokenizer(other)


def test_junction_proof_never_accepts_a_wrong_split(hf_tokenizer: Any, chat: ChatTokenizer) -> None:
    import random

    rng = random.Random(7)
    alphabet = [" ", "  ", "\n", "\n\n", "\t", ".", "!", "'s", "7", "a", "Word", "é", "中", "\r\n"]
    recs = []
    for i in range(300):
        content = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8)))
        recs.append(record(hf_tokenizer, i, thinking=bool(i % 2), content=content))
    for include_reasoning in (True, False):
        result = tokenize_completions(
            chat, recs, TokenizeOptions(include_reasoning=include_reasoning)
        )
        assert len(result.samples) + len(result.quarantined) == len(recs)
        for s in result.samples:
            text = hf_tokenizer.decode(s.input_ids)
            assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == s.input_ids


def test_the_byte_table_decodes_as_the_tokenizer_does(chat: ChatTokenizer) -> None:
    table = chat._byte_table  # from transformers' byte-to-unicode map: decodes_to uses it
    assert table is not None
    checked = 0
    for i, token_bytes in enumerate(table):
        text = chat.backend.decode([i], skip_special_tokens=False)
        if "\ufffd" not in text:  # a token holding part of a UTF-8 sequence decodes lossily
            assert token_bytes == text.encode("utf-8"), i
            checked += 1
    assert checked > len(table) // 2
    for text in ["plain", " spaced  out\n", "é naïve 数学 🙂", "<|im_end|>tail", "\t\r\n"]:
        ids = chat.encode([text])[0]
        assert chat.decodes_to(ids, text)
        assert not chat.decodes_to(ids, text + "x")
        assert not chat.decodes_to(ids[:-1], text)
