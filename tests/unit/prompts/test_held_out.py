"""The held-out split (include/prompts/held_out.py): seeded, per source and sampling variant,
out of every shard, written once with them and never moved by a re-run or a backfill."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from include.engine.variants import variant_name, variant_of
from include.layout import EVAL_MANIFEST_KEY, EVAL_PROMPTS_KEY
from include.prompts.errors import PrepareError
from include.prompts.plan import prepare_or_reuse
from include.storage import LocalStore
from synthetic_sources import rows, write_json_array, write_jsonl

THINKING = {"enable_thinking": [True, False]}


def _sources(tmp_path: Path, n: int = 200) -> list[dict]:
    write_jsonl(tmp_path / "cf.jsonl", list(rows("codefeedback", n, dup_share=0)))
    write_json_array(tmp_path / "mm.json", list(rows("metamathqa", n // 2, dup_share=0)))
    return [{"name": "cf", "path": str(tmp_path / "cf.jsonl")},
            {"name": "mm", "path": str(tmp_path / "mm.json")}]


def _prepare(settings) -> tuple[dict, LocalStore]:
    store = LocalStore(settings.run_uri)
    return prepare_or_reuse(settings, store), store


def _shard_ids(store: LocalStore, manifest: dict) -> list[str]:
    return [json.loads(line)["id"] for s in manifest["shards"]
            for line in store.read(s["key"]).decode().splitlines()]


def _held(store: LocalStore) -> list[dict]:
    return [json.loads(line) for line in store.read(EVAL_PROMPTS_KEY).decode().splitlines()]


def test_each_source_and_variant_holds_out_its_share_and_no_shard_holds_one(
        make_settings, tmp_path) -> None:
    settings = make_settings(_sources(tmp_path), held_out_per_source=4,
                             sampling_variants=THINKING, shard_size=50)
    manifest, store = _prepare(settings)
    held = _held(store)
    by = Counter((r["source"], variant_name(variant_of(r["id"], settings.seed, THINKING)))
                 for r in held)
    assert by == {(s, v): 4 for s in ("cf", "mm")
                  for v in ("enable_thinking=true", "enable_thinking=false")}
    assert not {r["id"] for r in held} & set(_shard_ids(store, manifest))
    for name in ("cf", "mm"):
        funnel = manifest["sources"][name]
        assert funnel["dropped"] == {"held_out": 8}
        assert funnel["kept"] + 8 == funnel["read"]
        assert len(funnel["drop_samples"]["held_out"]) == 5  # ids, as for every reason
    assert manifest["held_out"]["count"] == 16 == manifest["totals"]["held_out"]
    eval_manifest = json.loads(store.read(EVAL_MANIFEST_KEY))
    assert eval_manifest["per_source"] == {"cf": 8, "mm": 8}
    assert eval_manifest["count"] == len(held) and eval_manifest["split"] == "eval"
    # The records are the shards' own schema, byte for byte as a shard would hold them.
    assert set(held[0]) == {"id", "source", "messages", "metadata"}


def test_a_source_gives_at_most_a_tenth_and_a_small_one_none(make_settings, tmp_path) -> None:
    write_jsonl(tmp_path / "cf.jsonl", list(rows("codefeedback", 55, dup_share=0)))
    write_jsonl(tmp_path / "small.jsonl", list(rows("codefeedback", 9, dup_share=0)))
    settings = make_settings([{"name": "cf", "path": str(tmp_path / "cf.jsonl")},
                              {"name": "small", "path": str(tmp_path / "small.jsonl")}],
                             held_out_per_source=50)
    manifest, _ = _prepare(settings)
    assert manifest["held_out"]["per_source"] == {"cf": 5, "small": 0}


def test_the_split_is_seeded_and_a_rerun_or_backfill_never_moves_a_prompt(
        make_settings, tmp_path) -> None:
    sources = _sources(tmp_path)
    one = make_settings(sources, held_out_per_source=6, run_name="one")
    two = make_settings(sources, held_out_per_source=6, run_name="two")
    other_seed = make_settings(sources, held_out_per_source=6, run_name="three", seed=1)
    _, s1 = _prepare(one)
    _, s2 = _prepare(two)
    _, s3 = _prepare(other_seed)
    assert s1.read(EVAL_PROMPTS_KEY) == s2.read(EVAL_PROMPTS_KEY)
    assert s1.read(EVAL_PROMPTS_KEY) != s3.read(EVAL_PROMPTS_KEY)
    before = s1.read(EVAL_PROMPTS_KEY)
    # A backfill of the same run (a shard range) reuses shards and split as they are.
    again, _ = _prepare(make_settings(sources, held_out_per_source=6, run_name="one",
                                      shard_range="0-0"))
    assert s1.read(EVAL_PROMPTS_KEY) == before and again["held_out"]["count"] == 12
    # Another split size for the same run would move prompts: refused, naming the setting.
    with pytest.raises(PrepareError, match="held_out_per_source"):
        _prepare(make_settings(sources, held_out_per_source=7, run_name="one"))


def test_quotas_sample_from_the_prompts_left_for_training(make_settings, tmp_path) -> None:
    sources = _sources(tmp_path)
    sources[0]["quota"] = 30
    manifest, store = _prepare(make_settings(sources, held_out_per_source=5))
    cf = manifest["sources"]["cf"]
    assert cf["kept"] == 30 and cf["dropped"]["held_out"] == 5
    assert cf["dropped"]["over_quota"] == 200 - 30 - 5
    assert not {r["id"] for r in _held(store)} & set(_shard_ids(store, manifest))


def test_no_split_leaves_every_prompt_and_earlier_runs_match(make_settings, tmp_path) -> None:
    settings = make_settings(_sources(tmp_path), held_out_per_source=0)
    manifest, store = _prepare(settings)
    assert manifest["held_out"]["count"] == 0 and store.read(EVAL_PROMPTS_KEY) == b""
    assert "held_out" not in manifest["sources"]["cf"]["dropped"]
    # A run prepared before the setting existed recorded no value: 0 is what that meant.
    assert "held_out_per_source" not in manifest["preparation_settings"]
