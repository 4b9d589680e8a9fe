"""The tokenization stage's output quality filters and per-row provenance, end to end."""

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
from tests.unit.tokenization.test_stage import record


@pytest.fixture(scope="module")
def chat(hf_tokenizer: Any) -> ChatTokenizer:
    return ChatTokenizer(hf_tokenizer)


def planted_shard(tok: Any) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Return clean records and one planted failure per quality filter, with its reason."""
    template = ("I am sorry, but I cannot help with that request because it falls outside what "
                "I am able to assist with today; please consult a qualified professional or an "
                "official source, who will be able to give you accurate and complete guidance.")
    clean = [record(tok, 0), record(tok, 1, content=template)]
    planted = {
        "degenerate_repetition": record(tok, 2, content="Four. " + "Let me check again. " * 60),
        "unclosed_think": record(tok, 3, raw="<think>\nTwo plus two is"),
        "empty_answer": record(tok, 4, content=""),
        "invalid_tool_call_json": record(
            tok, 5, content='<tool_call>\n{"name": "add", "arguments": {"a": 2,}}\n</tool_call>'),
        "near_duplicate": record(tok, 6, content=template,
                                 messages=[{"role": "user", "content": "Another question?"}]),
    }
    return [*clean, *planted.values()], {r["id"]: reason for reason, r in planted.items()}


def test_quality_filters_quarantine_planted_failures_with_their_reasons(
    hf_tokenizer: Any, chat: ChatTokenizer, tmp_path
) -> None:
    records, want = planted_shard(hf_tokenizer)
    store = LocalStore(tmp_path)
    body = "".join(json.dumps(r) + "\n" for r in records).encode()
    publish_generated_shard(store, 0, body, {"counts": {}})
    manifest = tokenize_shard(store, 0, chat)
    assert {q["id"]: q["reason"] for q in manifest["quarantined"]} == want
    counts = manifest["counts"]
    assert counts["written"] == 2 and counts["input"] == len(records)
    assert {r: n for r, n in counts["quarantined"].items() if n} == dict.fromkeys(
        want.values(), 1)
    assert all(q["detail"] for q in manifest["quarantined"])
    assert manifest["settings"]["quality_filters_off"] == []


@pytest.mark.parametrize("name", ["degenerate_repetition", "unclosed_think", "empty_answer",
                                  "invalid_tool_call_json", "near_duplicate"])
def test_a_filter_turned_off_keeps_its_row(
    hf_tokenizer: Any, chat: ChatTokenizer, name: str
) -> None:
    records, want = planted_shard(hf_tokenizer)
    (planted_id,) = [i for i, reason in want.items() if reason == name]
    options = TokenizeOptions(quality_filters_off=frozenset({name}))
    result = tokenize_completions(chat, records, options)
    reasons = {q["id"]: q["reason"] for q in result.quarantined}
    assert name not in reasons.values()
    if name == "unclosed_think":  # nothing else objects to a thought that never closed
        assert planted_id in [s.id for s in result.samples]
    else:
        assert planted_id not in reasons and planted_id in [s.id for s in result.samples]
    assert result.manifest()["settings"]["quality_filters_off"] == [name]


def test_the_setting_reaches_the_stage_options() -> None:
    from include.settings import RunSettings

    settings = RunSettings.from_mapping({"quality_filters_off": ["near_duplicate"]})
    assert TokenizeOptions.from_settings(settings).quality_filters_off == {"near_duplicate"}
    assert TokenizeOptions.from_settings(RunSettings.from_mapping({})).quality_filters_off == set()


def test_every_row_carries_its_provenance(
    hf_tokenizer: Any, chat: ChatTokenizer, tmp_path
) -> None:
    import pyarrow.parquet as pq

    full = record(hf_tokenizer, 0)
    full.update(model="Qwen/Qwen3.6-27B", server="http://gpu-1:30000", server_version="0.5.23",
                sampling={"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 900,
                          "enable_thinking": True, "seed": 7})
    full["usage"]["prompt_tokens_details"] = {"cached_tokens": 5}
    bare = record(hf_tokenizer, 1)  # an older engine: no model, server, version or cache report
    bare["sampling"] = {"enable_thinking": "yes"}  # a wrong type is recorded as unknown
    store = LocalStore(tmp_path)
    body = "".join(json.dumps(r) + "\n" for r in (full, bare)).encode()
    publish_generated_shard(store, 3, body, {"counts": {}})
    tokenize_shard(store, 3, chat, run_name="expansion_v1")
    rows = pq.read_table(io.BytesIO(store.read("tokenized/shard-00003.parquet"))).to_pylist()
    first, second = rows
    assert {k: first[k] for k in (
        "run_name", "shard", "model", "server", "server_version", "prompt_tokens",
        "completion_tokens", "cached_tokens", "sampling_temperature", "sampling_top_p",
        "sampling_top_k", "sampling_max_tokens", "sampling_enable_thinking")} == {
        "run_name": "expansion_v1", "shard": "shard-00003", "model": "Qwen/Qwen3.6-27B",
        "server": "http://gpu-1:30000", "server_version": "0.5.23",
        "prompt_tokens": full["usage"]["prompt_tokens"],
        "completion_tokens": full["usage"]["completion_tokens"], "cached_tokens": 5,
        "sampling_temperature": 0.6, "sampling_top_p": 0.95, "sampling_top_k": 20,
        "sampling_max_tokens": 900, "sampling_enable_thinking": True}
    assert json.loads(first["sampling"]) == full["sampling"]  # every key sent, "seed" too
    assert second["run_name"] == "expansion_v1" and second["shard"] == "shard-00003"
    assert [second[k] for k in ("model", "server", "server_version", "cached_tokens",
                                "sampling_temperature", "sampling_enable_thinking")] == [None] * 6
    lines = store.read("tokenized/shard-00003.conversations.jsonl").decode().splitlines()
    prov = json.loads(lines[0])["provenance"]
    assert prov["sampling"] == full["sampling"] and prov["cached_tokens"] == 5
    assert prov["shard"] == "shard-00003" and prov["server_version"] == "0.5.23"


def test_datasets_loads_the_provenance_columns(
    hf_tokenizer: Any, chat: ChatTokenizer, tmp_path
) -> None:
    datasets = pytest.importorskip("datasets")
    a, b = record(hf_tokenizer, 0), record(hf_tokenizer, 1)
    a["usage"]["prompt_tokens_details"] = {"cached_tokens": 3}  # the other shard has none
    for index, rec in enumerate((a, b)):
        result = tokenize_completions(chat, [rec])
        result.origin = {"run_name": "r", "shard": f"shard-{index:05d}"}
        (tmp_path / f"{index}.parquet").write_bytes(result.to_parquet())
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "*.parquet"),
                               split="train", cache_dir=str(tmp_path / "cache"))
    assert sorted(ds["cached_tokens"], key=str) == [3, None]
    assert sorted(ds["shard"]) == ["shard-00000", "shard-00001"]


def test_a_filtered_record_keeps_the_filters_reason_and_order_holds_across_batches(
    hf_tokenizer: Any, chat: ChatTokenizer
) -> None:
    # Records are assembled and encoded in batches while the filters run: a record both a
    # filter and a check would refuse still gets the filter's reason, and every list keeps
    # the records' order across batches (checks._CHUNK records each).
    from include.tokenization import checks

    loop = record(hf_tokenizer, 1, content="Four. " + "Let me check again. " * 60)
    loop["usage"]["prompt_tokens"] += 1  # server_ids_mismatch too: the filter's reason wins
    records = [record(hf_tokenizer, i) for i in range(2 * checks._CHUNK + 5)]
    records[1] = loop
    wrong = [3, checks._CHUNK + 1, 2 * checks._CHUNK + 4]  # one per batch
    for i in wrong:
        ids = records[i]["response_token_ids"]
        records[i]["response_token_ids"] = [*ids[:-3], ids[-2], ids[-3], ids[-1]]  # swapped
    result = tokenize_completions(chat, records)
    assert [(q["id"], q["reason"]) for q in result.quarantined] == [
        (loop["id"], "degenerate_repetition"),
        *((records[i]["id"], "decode_mismatch") for i in wrong)]
    assert [s.id for s in result.samples] == [
        r["id"] for i, r in enumerate(records) if i != 1 and i not in wrong]
    for s, r in zip(result.samples, (r for i, r in enumerate(records)
                                     if i != 1 and i not in wrong), strict=True):
        assert s.input_ids == r["prompt_token_ids"] + r["response_token_ids"]
