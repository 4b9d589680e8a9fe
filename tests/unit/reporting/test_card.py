"""The dataset card: its YAML header parses, its numbers are the manifests', datasets loads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from include.layout import MANIFEST_KEY
from include.reporting.build import compute_report
from include.reporting.card import (
    DATA_FILES,
    FINGERPRINT_PLACEHOLDER,
    render_card,
    size_category,
)
from include.reporting.collect import collect_shard
from include.reporting.gates import QualityGates
from include.storage import LocalStore
from tests.unit.reporting.synthetic_run import ShardSpec, write_run

SHARDS = {
    "shard-00000": ShardSpec(completed=20, truncated=2, skipped=1, failed=1, quarantined=2),
    "shard-00001": ShardSpec(completed=30, truncated=6),
}
LOOSE = QualityGates(max_truncation_rate=1.0, max_failure_rate=1.0, max_quarantine_rate=1.0)
#: The synthetic sources as real kinds, and one source the run kept nothing from.
KINDS = {"alpha": "infinity_instruct", "beta": "hermes_function_calling"}


def _split(card: str) -> tuple[dict[str, Any], str]:
    assert card.startswith("---\n")
    head, body = card[4:].split("\n---\n", 1)
    return yaml.safe_load(head), body


def _table(body: str, heading: str) -> dict[str, list[str]]:
    """Return the first table under ``## heading`` as {first cell: the other cells}."""
    section = body.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("|")]
    return {cells[0]: cells[1:] for cells in
            ([c.strip() for c in ln.strip("|").split("|")] for ln in rows[2:])}


def _num(cell: str) -> int:
    return int(cell.replace(",", ""))


def _run(store: LocalStore, settings: Any, shard_ids: list[str],
         kinds: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return (report, prompt manifest) of the run in ``store``, sources given ``kinds``."""
    manifest = json.loads(store.read(MANIFEST_KEY))
    for name, kind in kinds.items():
        manifest["sources"].setdefault(name, {"read": 5, "kept": 0, "dropped": {"empty": 5}})
        manifest["sources"][name]["kind"] = kind
    shards = [collect_shard(store, sid, False) for sid in shard_ids]
    report = compute_report(settings, manifest, shards, run_id="r1", outputs_uri=store.root,
                            gates=LOOSE)
    return report, manifest


def test_header_parses_and_its_numbers_are_the_manifests(store, settings) -> None:
    write_run(store, SHARDS)
    report, manifest = _run(store, settings, list(SHARDS),
                            {**KINDS, "unused": "metamathqa"})
    header, body = _split(render_card(report, manifest, settings.to_dict()))
    tokenized = [json.loads(store.read(f"tokenized/{sid}.manifest.json")) for sid in SHARDS]
    rows = sum(m["counts"]["written"] for m in tokenized)
    assert rows == 48  # 50 completions, 2 quarantined
    assert header["dataset_info"]["splits"] == [{"name": "train", "num_examples": rows}]
    assert header["size_categories"] == ["n<1K"]
    assert header["task_categories"] == ["text-generation"]
    assert header["configs"] == [{"config_name": "default",
                                  "data_files": [{"split": "train", "path": DATA_FILES}]}]
    # Licences of the sources with rows only: metamathqa's (mit) kept nothing.
    assert header["license"] == ["apache-2.0", "cc-by-sa-4.0"]
    sources = _table(body, "Sources")
    assert set(sources) == {"alpha", "beta"}
    assert sum(_num(v[1]) for v in sources.values()) == rows
    tokens = _table(body, "Tokens")
    assert _num(tokens["all"][0]) == report["tokens"]["prompt_tokens"] == sum(
        10 + i for spec in SHARDS.values() for i in range(spec.completed))
    assert _num(tokens["all"][1]) == report["tokens"]["completion_tokens"]
    assert _num(tokens["alpha"][1]) == report["tokens"]["per_source"]["alpha"][
        "completion_tokens"]
    assert tokens["all"][2] == "not reported"  # the report has no reasoning tokens yet
    funnel = _table(body, "Funnel and filters")
    assert funnel["alpha"][7] == "decode_mismatch 1" == funnel["beta"][7]
    assert _num(funnel["alpha"][3]) + _num(funnel["beta"][3]) == 50
    assert f"{sum(m['tokens']['loss'] for m in tokenized):,} of them in the loss" in body


def test_an_unrecorded_licence_is_other_and_servers_and_fingerprint_are_shown(
        store, settings) -> None:
    write_run(store, SHARDS)
    report, manifest = _run(store, settings, list(SHARDS),
                            {"alpha": "codefeedback", "beta": "metamathqa"})
    header, body = _split(render_card(report, manifest, settings.to_dict()))
    assert header["license"] == ["mit", "other"]
    assert "SGLang version and `weight_version` per server: not reported." in body
    assert f"Settings fingerprint: `{FINGERPRINT_PLACEHOLDER}`" in body
    servers = [{"url": "http://s0:1", "model": "m", "version": "0.5.23",
                "weight_version": "default"}, {"url": "http://s1:1", "model": "m"}]
    _, body = _split(render_card(report, manifest, settings.to_dict(), servers=servers,
                                 settings_fingerprint="abc123"))
    target = _table(body, "Target model")
    assert target["http://s0:1"] == ["m", "0.5.23", "default"]
    assert target["http://s1:1"] == ["m", "not reported", "not reported"]
    assert "Settings fingerprint: `abc123`" in body
    sampling = _table(body, "Sampling")
    assert sampling["temperature"] == [str(settings.temperature)]
    assert sampling["max_tokens"] == [f"{settings.max_tokens:,}"]


def test_excluded_source_values_are_listed_with_their_drop_count(store, settings) -> None:
    write_run(store, SHARDS)
    report, manifest = _run(store, settings, list(SHARDS), {"alpha": "webinstructsub"})
    manifest["preparation_settings"] = {"sources": [
        {"name": "alpha", "kind": "webinstructsub", "exclude_sources": ["socratic"]},
        {"name": "beta", "exclude_sources": []}]}
    manifest["sources"]["alpha"]["dropped"]["filtered_source"] = 7
    _, body = _split(render_card(report, manifest, settings.to_dict()))
    sources = _table(body, "Sources")
    assert sources["alpha"][0] == "TIGER-Lab/WebInstructSub"
    assert sources["alpha"][3] == "socratic (7 rows dropped)"
    assert "CC BY-NC 4.0" in sources["alpha"][4]
    assert sources["beta"][3] == "none (0 rows dropped)"


@pytest.mark.parametrize(("rows", "bucket"), [
    (0, "n<1K"), (999, "n<1K"), (1000, "1K<n<10K"), (9999, "1K<n<10K"),
    (10_000, "10K<n<100K"), (999_999, "100K<n<1M"), (1_000_000, "1M<n<10M"),
    (10**12 - 1, "100B<n<1T"), (10**12, "n>1T"),
])
def test_size_category_boundaries(rows: int, bucket: str) -> None:
    assert size_category(rows) == bucket


# --- datasets loads what the real tokenize stage wrote ----------------------------------------
@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    from include.tokenization import ChatTokenizer
    from sglang_standin.tokenizer import build_chat_tokenizer

    path = build_chat_tokenizer(tmp_path_factory.mktemp("tok") / "small", vocab="small")
    return ChatTokenizer(AutoTokenizer.from_pretrained(str(path), local_files_only=True))


def _completion(tok: Any, pid: str, source: str, answer: str) -> dict[str, Any]:
    """Return a completed record as the engine journals an SGLang 0.5.23 answer with ids."""
    messages = [{"role": "user", "content": f"Question {pid}?"}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                     enable_thinking=False)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    sampled = tok(answer, add_special_tokens=False)["input_ids"] + [eot]
    return {"id": pid, "source": source, "status": "completed", "messages": messages,
            "text": answer, "finish_reason": "stop", "matched_stop": eot,
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(sampled),
                      "total_tokens": len(prompt_ids) + len(sampled)},
            "sampling": {"enable_thinking": False}, "prompt_token_ids": prompt_ids,
            "response_token_ids": sampled, "model": "m", "server": "http://s0:1",
            "timings": {"latency_s": 1.0, "attempts": 1, "finished_at": 1e9 + len(pid)}}


def test_datasets_loads_the_tokenized_shards_by_the_cards_data_files(
        tmp_path: Path, settings: Any, chat: Any) -> None:
    import datasets
    import pyarrow.parquet as pq

    from include.durability.journal import StoreJournal
    from include.generation.shard import build_shard_output
    from include.storage import publish_generated_shard
    from include.tokenization import tokenize_shard

    out = tmp_path / "outputs"
    store = LocalStore(out)
    sources = {}
    for index, n in enumerate((3, 4)):
        sid = f"shard-{index:05d}"
        recs = {f"{s}:default:{sid}-{i}": _completion(chat.tokenizer, f"{s}:default:{sid}-{i}",
                                                      s, "word " * (i + 1))
                for i, s in enumerate(("alpha", "beta") * n)}
        for rec in recs.values():
            sources[rec["source"]] = sources.get(rec["source"], 0) + 1
        journal = StoreJournal(store, f"journal/{sid}")
        for rec in recs.values():
            journal.append(rec)
        journal.close()
        prompts = [{"id": r["id"], "source": r["source"], "messages": r["messages"]}
                   for r in recs.values()]
        data, manifest = build_shard_output(sid, prompts, recs)
        publish_generated_shard(store, index, data, manifest)
        tokenize_shard(store, index, chat)
    store.write_new(MANIFEST_KEY, json.dumps({
        "sources": {s: {"kind": KINDS[s], "read": k, "kept": k, "dropped": {}}
                    for s, k in sources.items()},
        "totals": {"read": 14, "kept": 14, "dropped": 0},
        "shards": [{"shard_id": "shard-00000", "count": 6},
                   {"shard_id": "shard-00001", "count": 8}]}).encode())
    report, manifest = _run(store, settings, ["shard-00000", "shard-00001"], {})
    assert report["tokenization"]["totals"]["written"] == 14  # the real stage kept every row
    card = render_card(report, manifest, settings.to_dict())
    header, _ = _split(card)
    (out / "README.md").write_text(card)
    pattern = header["configs"][0]["data_files"][0]["path"]
    cache = str(tmp_path / "hf-cache")
    ds = datasets.load_dataset("parquet", data_files=str(out / pattern), split="train",
                               cache_dir=cache)
    assert ds.num_rows == header["dataset_info"]["splits"][0]["num_examples"] == 14
    written = pq.read_table(out / "tokenized/shard-00000.parquet").to_pylist()
    assert ds[0]["input_ids"] == written[0]["input_ids"]
    assert ds[0]["loss_mask"] == written[0]["loss_mask"]
    assert sorted(set(ds["source"])) == ["alpha", "beta"]
    # The folder as a hub dataset: datasets reads the card's own configs and split sizes.
    by_card = datasets.load_dataset(str(out), split="train", cache_dir=cache)
    assert by_card.num_rows == 14 and by_card["id"] == ds["id"]
