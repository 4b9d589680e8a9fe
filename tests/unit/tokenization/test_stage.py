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
from include.tokenization.checks import verify
from include.tokenization.outputs import QUARANTINE_REASONS, length_stats


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
    content: str = "It is four, because two and two make four.",
    reasoning: str | None = "Two plus two.\nThat is four.",
    finish: str = "stop",
    source: str = "metamathqa",
    messages: list[dict[str, str]] | None = None,
    prompt_tokens: int | None = None,
    ids: bool = True,
    sampled: list[int] | None = None,
    raw: str | None = None,
) -> dict[str, Any]:
    """Return a completion record as the engine writes it from an SGLang 0.5.23 answer.

    The model's raw output is generated first (``<think>\\n R \\n</think>\\n\\n C``), the
    server returns it whole (``separate_reasoning`` off) with the ids it sampled, through the
    matched ``<|im_end|>``. ``ids=False`` is an older server: text only. ``sampled`` replaces
    the canonical ids (a model may sample a non-canonical split of the same text).
    """
    messages = messages or MESSAGES
    prompt = tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
    )
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    if raw is None:
        raw = f"<think>\n{reasoning}\n</think>\n\n{content}" if thinking else content
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    if sampled is None:
        sampled = tok(raw, add_special_tokens=False)["input_ids"] + ([eot] if finish == "stop"
                                                                     else [])
    rec: dict[str, Any] = {
        "id": f"{source}:default:{i}",
        "source": source,
        "messages": messages,
        "status": "completed",
        "text": raw,
        "finish_reason": finish,
        "matched_stop": eot if finish == "stop" else None,
        "usage": {
            "prompt_tokens": len(prompt_ids) if prompt_tokens is None else prompt_tokens,
            "completion_tokens": len(sampled),
            "total_tokens": len(prompt_ids) + len(sampled),
        },
        "sampling": {"enable_thinking": thinking},
    }
    if ids:
        rec["prompt_token_ids"] = prompt_ids
        rec["response_token_ids"] = sampled
    return rec


def split(tok: Any, sample: Any) -> tuple[str, str]:
    """Return (unmasked text, masked text) decoded from the sample."""
    head = [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if not m]
    tail = [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
    assert sample.loss_mask == [0] * len(head) + [1] * len(tail)  # one contiguous masked span
    return tok.decode(head), tok.decode(tail)


def masked(sample: Any) -> list[int]:
    return [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("include_reasoning", [True, False])
def test_a_row_is_the_servers_prompt_ids_and_sampled_ids(
    hf_tokenizer: Any, chat: ChatTokenizer, thinking: bool, include_reasoning: bool
) -> None:
    rec = record(hf_tokenizer, thinking=thinking)
    result = tokenize_completions(chat, [rec], TokenizeOptions(include_reasoning=include_reasoning))
    assert not result.quarantined and not result.dropped
    (sample,) = result.samples
    prompt_ids, sampled = rec["prompt_token_ids"], rec["response_token_ids"]
    assert sample.input_ids[: len(prompt_ids)] == prompt_ids
    assert sample.token_source == "server"
    head, tail = split(hf_tokenizer, sample)
    if thinking and include_reasoning:
        assert sample.input_ids == prompt_ids + sampled and masked(sample) == sampled
        # One "\n\n" after </think>, as the model wrote it (the 0.5.23 rebuild had four).
        assert tail == rec["text"] + "<|im_end|>" and "</think>\n\nIt is" in tail
        assert "\n\n\n" not in tail
        assert sample.conversation[-1]["content"] == rec["text"]
    elif thinking:  # the template's empty think block stands in the prompt, untrained
        after = sampled[sampled.index(chat.think_close_id) + 1 :]
        assert masked(sample) == after
        assert head.endswith("<|im_start|>assistant\n<think>\n\n</think>")
        assert tail == "\n\n" + rec["text"].split("</think>\n\n")[1] + "<|im_end|>"
        assert sample.conversation[-1]["content"] == "It is four, because two and two make four."
    else:
        assert head.endswith("<think>\n\n</think>\n\n") and masked(sample) == sampled
    assert sample.length == len(sample.input_ids) and sample.finish_reason == "stop"
    # The dataset's messages are marked as the dataset's; the answer as the target's.
    assert sample.conversation[:-1] == [{**m, "generated": False} for m in MESSAGES]
    assert sample.conversation[-1]["role"] == "assistant"
    assert sample.conversation[-1]["generated"] is True
    assert result.manifest()["counts"]["token_source"] == {"server": 1, "text": 0}


def test_non_canonical_sampled_ids_are_kept_and_counted(
    hf_tokenizer: Any, chat: ChatTokenizer
) -> None:
    vocab = hf_tokenizer.get_vocab()
    canonical = record(hf_tokenizer, 0, thinking=False, content="It is four")
    ids = canonical["response_token_ids"]
    # Find a token that two other tokens spell: the model may sample those two instead.
    for pos, tid in enumerate(ids[:-1]):
        piece = hf_tokenizer.convert_ids_to_tokens(tid)
        cuts = [(piece[:k], piece[k:]) for k in range(1, len(piece))
                if piece[:k] in vocab and piece[k:] in vocab]
        if cuts:
            left, right = cuts[0]
            split_ids = ids[:pos] + [vocab[left], vocab[right]] + ids[pos + 1 :]
            break
    else:
        pytest.skip("no splittable token in the sample text")
    rec = record(hf_tokenizer, 1, thinking=False, content="It is four", sampled=split_ids)
    result = tokenize_completions(chat, [canonical, rec])
    assert not result.quarantined
    assert masked(result.samples[1]) == split_ids  # what the target sampled, not a re-encode
    assert masked(result.samples[0]) == ids
    assert result.manifest()["counts"]["retokenized_text_differs"] == 1


@pytest.mark.parametrize("thinking", [True, False])
def test_a_server_without_ids_gives_the_raw_text_encoded(
    hf_tokenizer: Any, chat: ChatTokenizer, thinking: bool
) -> None:
    rec = record(hf_tokenizer, thinking=thinking, ids=False)
    (sample,) = tokenize_completions(chat, [rec]).samples
    prompt = hf_tokenizer.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
    )
    assert sample.token_source == "text"
    assert split(hf_tokenizer, sample) == (prompt, rec["text"] + "<|im_end|>")
    # A text that re-encodes to another count than the server sampled is not its ids.
    off = record(hf_tokenizer, 1, thinking=thinking, ids=False)
    off["usage"]["completion_tokens"] += 1
    result = tokenize_completions(chat, [off])
    assert [q["reason"] for q in result.quarantined] == ["retokenized_count_mismatch"]


@pytest.mark.parametrize(
    "content",
    [" leading space", "  two spaces", "\tTab", "!bang", "123 digits", "é accent", "x", "中文答案",
     "\nled by newline"],
)
def test_awkward_starts_keep_the_servers_ids(
    hf_tokenizer: Any, chat: ChatTokenizer, content: str
) -> None:
    recs = [
        record(hf_tokenizer, 0, thinking=False, content=content),
        record(hf_tokenizer, 1, thinking=True, content=content, reasoning=content),
    ]
    result = tokenize_completions(chat, recs)
    assert not result.quarantined
    for rec, s in zip(recs, result.samples, strict=True):
        assert s.input_ids == rec["prompt_token_ids"] + rec["response_token_ids"]


def test_every_quarantine_reason_is_counted_with_its_id(
    hf_tokenizer: Any, chat: ChatTokenizer
) -> None:
    good = record(hf_tokenizer, 0)
    legacy = record(hf_tokenizer, 5, ids=False)
    del legacy["text"]
    legacy.update(content="It is four.", reasoning_content="Two plus two.")
    wrong_ids = record(hf_tokenizer, 6)
    wrong_ids["response_token_ids"] = wrong_ids["response_token_ids"][:-2] + [
        wrong_ids["response_token_ids"][-1]
    ]
    wrong_ids["usage"]["completion_tokens"] -= 1  # consistent counts, but not this text's ids
    cut_in_reasoning = record(hf_tokenizer, 10, raw="<think>\nTwo plus", finish="length")
    bad = {
        "invalid_record": {**record(hf_tokenizer, 1), "usage": {}},
        "unexpected_finish_reason": record(hf_tokenizer, 2, finish="abort"),
        "template_mismatch": record(hf_tokenizer, 3, thinking=False,
                                    content="<think>x</think>answer"),
        "no_raw_text": legacy,
        "server_ids_mismatch": record(hf_tokenizer, 4, prompt_tokens=7),
        "prompt_tokens_mismatch": record(hf_tokenizer, 7, prompt_tokens=7, ids=False),
        "retokenized_count_mismatch": {
            **record(hf_tokenizer, 8, ids=False),
            "usage": {"prompt_tokens": good["usage"]["prompt_tokens"], "completion_tokens": 3},
        },
        "decode_mismatch": wrong_ids,
        "mask_all_one": {**record(hf_tokenizer, 9), "prompt_token_ids": [],
                         "usage": {"prompt_tokens": 0,
                                   "completion_tokens": good["usage"]["completion_tokens"]}},
    }
    result = tokenize_completions(chat, [good, *bad.values()])
    reasons = {q["id"]: q["reason"] for q in result.quarantined}
    assert reasons == {rec["id"]: reason for reason, rec in bad.items()}
    assert [s.id for s in result.samples] == [good["id"]]
    assert all(q["detail"] for q in result.quarantined)
    result = tokenize_completions(
        chat, [cut_in_reasoning],
        TokenizeOptions(include_reasoning=False, keep_truncated_completions=True),
    )
    assert [q["reason"] for q in result.quarantined] == ["mask_all_zero"]
    assert set(result.manifest()["counts"]["quarantined"]) == set(QUARANTINE_REASONS)


def test_verify_reads_the_sample_back_against_the_servers_ids() -> None:
    prompt, sampled = [1, 2, 3], [7, 8, 9]
    assert verify(prompt + sampled, [0, 0, 0, 1, 1, 1], prompt, sampled) is None
    assert verify([1, 2, 4, 7, 8, 9], [0, 0, 0, 1, 1, 1], prompt, sampled)[0] == (
        "prompt_ids_mismatch")
    assert verify(prompt + sampled, [0, 0, 1, 1, 1, 1], prompt, sampled)[0] == (
        "prompt_ids_mismatch")
    assert verify(prompt + [7, 9, 8], [0, 0, 0, 1, 1, 1], prompt, sampled)[0] == (
        "masked_ids_mismatch")
    assert verify(prompt + sampled, [0, 0, 0, 1, 1, 0], prompt, sampled)[0] == (
        "masked_ids_mismatch")


def test_ids_that_stop_before_the_end_of_turn_are_closed_untrained(
    hf_tokenizer: Any, chat: ChatTokenizer
) -> None:
    rec = record(hf_tokenizer, thinking=False)
    rec["response_token_ids"] = rec["response_token_ids"][:-1]  # a server that trims the stop
    rec["usage"]["completion_tokens"] -= 1
    rec["matched_stop"] = None
    result = tokenize_completions(chat, [rec])
    (sample,) = result.samples
    assert sample.input_ids[-1] == chat.end_of_turn_id and sample.loss_mask[-1] == 0
    assert masked(sample) == rec["response_token_ids"]
    assert result.manifest()["counts"]["closed_by_template"] == 1


def test_truncated_completions_are_dropped_unless_kept(
    hf_tokenizer: Any, chat: ChatTokenizer
) -> None:
    cut_answer = record(hf_tokenizer, 0, content="It is fo", finish="length")
    cut_thought = record(hf_tokenizer, 1, raw="<think>\nTwo plus", finish="length")
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
    # Long, but not a loop ("four " * 200 is one: the repetition filter would take it).
    long = record(hf_tokenizer, 1, content=" ".join(f"four{i}" for i in range(200)))
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
    result = tokenize_completions(
        chat, [*recs, record(hf_tokenizer, 9, prompt_tokens=1, ids=False)]
    )
    table = pq.read_table(io.BytesIO(result.to_parquet()))
    assert table.schema == pa.schema(
        [
            ("input_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("length", pa.int32()),
            ("source", pa.string()),
            ("id", pa.string()),
            ("finish_reason", pa.string()),
            ("token_source", pa.string()),
            ("run_name", pa.string()),
            ("shard", pa.string()),
            ("model", pa.string()),
            ("server", pa.string()),
            ("server_version", pa.string()),
            ("weight_version", pa.string()),
            ("prompt_tokens", pa.int32()),
            ("completion_tokens", pa.int32()),
            ("cached_tokens", pa.int32()),
            ("sampling_temperature", pa.float64()),
            ("sampling_top_p", pa.float64()),
            ("sampling_top_k", pa.int32()),
            ("sampling_max_tokens", pa.int32()),
            ("sampling_enable_thinking", pa.bool_()),
            ("sampling_variant", pa.string()),
            ("sampling", pa.string()),
        ]
    )
    rows = table.to_pylist()
    assert [r["id"] for r in rows] == [r["id"] for r in recs]
    assert all(r["length"] == len(r["input_ids"]) == len(r["loss_mask"]) for r in rows)
    assert rows[2]["input_ids"] == result.samples[2].input_ids
    lines = result.conversations_jsonl().decode().splitlines()
    first = json.loads(lines[0])
    assert len(lines) == 6 and set(first) == {"id", "conversations", "provenance"}
    assert all(set(turn) == {"role", "content", "generated"} for turn in first["conversations"])
    assert [t["role"] for t in first["conversations"]] == ["system", "user", "assistant"]
    assert [t["generated"] for t in first["conversations"]] == [False, False, True]
    # The trainer export: the parquet's rows, in its order, with nothing re-tokenized.
    result.origin = {"run_name": "r", "shard": "shard-00003"}
    exported = [json.loads(line) for line in result.pretokenized_jsonl().decode().splitlines()]
    assert [(e["id"], e["input_ids"], e["loss_mask"]) for e in exported] == [
        (r["id"], r["input_ids"], r["loss_mask"]) for r in rows]
    assert {tuple(sorted(e)) for e in exported} == {
        ("id", "input_ids", "loss_mask", "run_name", "shard", "source")}
    assert {(e["run_name"], e["shard"]) for e in exported} == {("r", "shard-00003")}
    assert [e["source"] for e in exported] == [r["source"] for r in rows]
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


def test_the_empty_think_block_is_read_off_the_template(
    hf_tokenizer: Any, chat: ChatTokenizer
) -> None:
    import copy

    from include.target_tokenizer import TokenizerError

    assert chat.empty_think_closing() == "<think>\n\n</think>"
    other = copy.deepcopy(hf_tokenizer)
    other.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    plain = ChatTokenizer(other)
    rec = record(other, 0)
    with pytest.raises(TokenizerError, match="empty think block"):
        plain.empty_think_closing()
    result = tokenize_completions(plain, [rec], TokenizeOptions(include_reasoning=False))
    assert [q["reason"] for q in result.quarantined] == ["template_mismatch"]
    # With reasoning kept, a template of any layout is fine: the row is the server's ids.
    assert tokenize_completions(plain, [rec]).samples[0].input_ids == (
        rec["prompt_token_ids"] + rec["response_token_ids"])


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
        # Ids outside the table never decode (a negative one must not read it from the end).
        assert not chat.decodes_to([*ids, len(table)], text)
        assert not chat.decodes_to([*ids[:-1], ids[-1] - len(table)], text)
    one = chat.encode(["x"])[0]
    assert len(one) == 1 and chat.decodes_to(one, "x") and chat.decodes_to([], "")
    assert not chat.decodes_to([-len(table) + one[0]], "x") and not chat.decodes_to([], "x")


def test_ids_that_break_a_utf8_character_spell_the_lossy_text_the_server_returns(
        chat: ChatTokenizer) -> None:
    # Seen from the real SGLang: a model samples half of a character's bytes; the server's
    # text (and the tokenizer's decode) holds U+FFFD there. The ids still spell that text.
    table = chat._byte_table
    assert table is not None
    half = next(i for i, b in enumerate(table) if len(b) == 1 and b[0] >= 0x80)
    word = chat.encode([" word"])[0]
    ids = [*word, half, *word]
    lossy = chat.backend.decode(ids, skip_special_tokens=False)
    assert "\ufffd" in lossy
    assert chat.decodes_to(ids, lossy)
    assert not chat.decodes_to(ids, lossy.replace("\ufffd", "?"))
    assert not chat.decodes_to([*word, *word], lossy)
    assert not chat.decodes_to(ids, "\ud800")  # a lone surrogate is no text: no crash either



def test_text_path_counts_what_re_tokenizing_the_conversations_would_change(
    hf_tokenizer: Any, chat: ChatTokenizer
) -> None:
    # A multi-turn prompt (an agent set's "OK." turn, no system turn) answered once, a
    # single-turn prompt with a system turn, and an answer cut at max_tokens.
    agent = [{"role": "user", "content": "You are an OS agent."},
             {"role": "assistant", "content": "OK."}, {"role": "user", "content": "ls?"}]
    recs = [record(hf_tokenizer, 0, messages=agent), record(hf_tokenizer, 1),
            record(hf_tokenizer, 2, finish="length")]
    result = tokenize_completions(chat, recs,
                                  TokenizeOptions(keep_truncated_completions=True))
    assert [s.id for s in result.samples] == [r["id"] for r in recs], result.quarantined
    assert [m["generated"] for m in result.samples[0].conversation] == [False, False, False,
                                                                        True]
    tp = result.manifest()["text_path"]
    assert tp == {"rows": 3, "end_of_turn_newline": 2,
                  "retokenized_text_differs": result.retokenized_text_differs,
                  "without_system": 1, "with_dataset_turns": 1, "dataset_turns": 1}


BREAKS = "one\u2028two\u2029three\x85four"


def test_every_jsonl_the_run_writes_splits_right_with_splitlines(hf_tokenizer: Any,
                                                                  chat: ChatTokenizer) -> None:
    """U+2028, U+2029 and NEL are valid raw in JSON, but ``str.splitlines()`` breaks a line
    there: every JSONL writer escapes them, and the record reads back the same."""
    from include.durability.journal import _encode
    from include.generation.shard import build_shard_output
    from include.prompts.encoding import encode_record

    messages = [{"role": "user", "content": f"Say {BREAKS}."}]
    recs = [record(hf_tokenizer, i, messages=messages, content=f"Answer {BREAKS}")
            for i in range(3)]
    prompt_lines = b"".join(encode_record({"id": r["id"], "messages": messages}) for r in recs)
    journal_lines = b"".join(_encode(r) for r in recs)
    prompts = [{"id": r["id"], "messages": messages, "source": r["source"]} for r in recs]
    generated, _ = build_shard_output("shard-00000", prompts, {r["id"]: r for r in recs})
    result = tokenize_completions(chat, recs)
    assert len(result.samples) == 3
    files = {"prompts": prompt_lines, "journal": journal_lines, "generated": generated,
             "conversations": result.conversations_jsonl()}
    for name, data in files.items():
        lines = data.decode().splitlines()
        assert len(lines) == 3, name
        read = [json.loads(line) for line in lines]
        assert all(BREAKS in json.dumps(r, ensure_ascii=False) for r in read), name
