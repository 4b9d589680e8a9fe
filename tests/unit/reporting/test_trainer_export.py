"""The report's trainer export: the whole run in one file, and the card's training section."""

from __future__ import annotations

import json

import yaml

from include.layout import card_key, pretokenized_key, pretokenized_run_key
from include.reporting import QualityGates, build_report
from include.reporting.trainers import SPECFORGE_DEFAULT_MAX_LENGTH
from tests.unit.reporting.synthetic_run import ShardSpec, write_run

LOOSE = QualityGates(max_truncation_rate=1.0, max_failure_rate=1.0, max_quarantine_rate=1.0)
SHARDS = {"shard-00000": ShardSpec(completed=20), "shard-00001": ShardSpec(completed=30),
          "shard-00002": ShardSpec(completed=5)}


def _report(store, settings, run_id="r1"):
    build_report(settings, store, store, list(SHARDS), [], run_id=run_id, gates=LOOSE,
                 plots=False)
    return json.loads(store.read(f"report/{run_id}/report.json"))


def _rows(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode().splitlines()]


def test_the_publishing_report_joins_every_shards_export_in_shard_order(store, settings):
    write_run(store, SHARDS)
    report = _report(store, settings)
    whole = store.read(pretokenized_run_key())
    parts = b"".join(store.read(pretokenized_key(n)) for n in range(3))
    assert whole == parts and len(_rows(whole)) == 55
    assert [r["shard"] for r in _rows(whole)] == ["shard-00000"] * 20 + ["shard-00001"] * 30 \
        + ["shard-00002"] * 5
    export = report["trainer_export"]
    assert export["written"] and export["bytes"] == len(whole) and export["shards"] == 3
    # The longest row is shard-00001's last (110 + 29 tokens): the trainers' max_length.
    assert report["trainers"]["longest_row"] == 139 == max(len(r["input_ids"])
                                                          for r in _rows(whole))
    page = store.read("report/r1/report.md").decode()
    assert f"{export['bytes']:,} bytes from 3 shards" in page and "Longest row 139" in page
    # A retried report rebuilds the same bytes and succeeds.
    assert _report(store, settings, run_id="r1")["trainer_export"]["written"]


def test_the_card_says_how_to_train_with_the_runs_own_figures(store, settings):
    write_run(store, SHARDS)
    _report(store, settings)
    card = store.read(card_key()).decode()
    section = card.split("## Training on this run", 1)[1].split("\n## ", 1)[0]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    data = yaml.safe_load(block)["data"]
    assert data == {"prompts_path": "./pretokenized.jsonl", "max_length": 139}
    assert "--data ./pretokenized" in section and "--seq-length 139" in section
    assert "NeMo Automodel" in section and "cannot" in section
    # 139 tokens fit SpecForge's default, so no warning about cut rows.
    assert SPECFORGE_DEFAULT_MAX_LENGTH >= 139 and "would cut" not in section
    assert "every one of the 55 rows" in section


def test_a_shard_without_an_export_keeps_the_whole_run_file_unwritten_and_says_why(
        store, settings):
    write_run(store, {**SHARDS, "shard-00001": ShardSpec(completed=30, export=False)})
    report = _report(store, settings)
    assert not store.exists(pretokenized_run_key())
    assert not report["trainer_export"]["written"]
    assert "shard-00001" in report["trainer_export"]["reason"]
    assert "shard-00001" in store.read(card_key()).decode()
