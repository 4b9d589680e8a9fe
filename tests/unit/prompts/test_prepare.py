"""The prepare stage: funnel arithmetic, every drop reason, dedupe, quotas, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from include.layout import MANIFEST_KEY
from include.prompts import PREPARE_DROP_REASONS, PrepareError, prepare_prompts, read_shard
from include.prompts.readers import SourceReadError
from include.prompts.schemas import UnknownLayoutError
from include.settings import RunSettings, SettingsError
from include.settings.deployment import bundled_catalogue
from include.storage import LocalStore, ObjectExistsError
from synthetic_sources import (
    JSONL_TRAP_LINES,
    TRAPS,
    rows,
    write_json_array,
    write_jsonl,
    write_parquet,
    write_sample_set,
)


def _all_prompts(store: LocalStore, manifest: dict) -> list[dict]:
    return [rec for i in range(len(manifest["shards"])) for rec in read_shard(store, i)]


def _run(settings: RunSettings) -> tuple[dict, LocalStore]:
    store = LocalStore(settings.run_uri)
    return prepare_prompts(settings, store), store


@pytest.fixture
def sample_dir(tmp_path: Path) -> Path:
    d = tmp_path / "samples"
    write_sample_set(d, n=80)
    return d


def _sample_sources(d: Path) -> list[dict]:
    out = []
    for s in (e.model_dump() for e in bundled_catalogue().values()):
        s["path"] = str(d / Path(s["path"]).name)
        out.append(s)
    return out


def test_every_row_read_is_kept_in_one_shard_or_counted_under_one_reason(
    make_settings, sample_dir
) -> None:
    manifest, store = _run(make_settings(_sample_sources(sample_dir), shard_size=37))
    prompts = _all_prompts(store, manifest)
    ids = [p["id"] for p in prompts]
    assert len(ids) == len(set(ids)), "a prompt id appears in two places"
    for name, funnel in manifest["sources"].items():
        assert funnel["read"] == funnel["kept"] + sum(funnel["dropped"].values()), name
        assert funnel["kept"] == sum(1 for p in prompts if p["source"] == name), name
        assert set(funnel["dropped"]) <= set(PREPARE_DROP_REASONS)
    assert manifest["totals"]["kept"] == len(prompts)
    assert sum(s["count"] for s in manifest["shards"]) == len(prompts)
    assert all(s["count"] <= 37 for s in manifest["shards"])


def test_trap_rows_land_under_their_documented_reason(make_settings, tmp_path) -> None:
    sources = []
    for kind, traps in TRAPS.items():
        path = tmp_path / f"{kind}.parquet"
        write_parquet(path, [row for row, _ in traps])
        sources.append(
            {
                "name": kind,
                "kind": kind,
                "path": str(path),
                "exclude_sources": ["socratic"] if kind == "webinstructsub" else [],
            }
        )
    manifest, _ = _run(make_settings(sources))
    for kind, traps in TRAPS.items():
        expected: dict[str, int] = {}
        for _, reason in traps:
            if reason:
                expected[reason] = expected.get(reason, 0) + 1
        got = manifest["sources"][kind]
        assert got["dropped"] == expected, kind
        assert got["kept"] == sum(1 for _, r in traps if r is None), kind


def test_jsonl_with_non_string_and_broken_lines_counts_them_as_malformed(
    make_settings, tmp_path
) -> None:
    path = tmp_path / "cf.jsonl"
    write_jsonl(path, list(rows("codefeedback", 20, dup_share=0)), JSONL_TRAP_LINES)
    manifest, _ = _run(make_settings([{"name": "cf", "path": str(path)}]))
    funnel = manifest["sources"]["cf"]
    assert funnel["kind"] == "codefeedback"
    assert funnel["read"] == 22 and funnel["dropped"] == {"malformed": 2}
    samples = " ".join(funnel["drop_samples"]["malformed"])
    assert "holds int" in samples and "invalid JSON" in samples


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
@pytest.mark.parametrize("form", ["array", "lines"])
def test_json_array_and_json_lines_are_read_whatever_the_extension(
    make_settings, tmp_path, suffix, form
) -> None:
    records = list(rows("metamathqa", 15, dup_share=0))
    path = tmp_path / f"mm{suffix}"
    (write_json_array if form == "array" else write_jsonl)(path, records)
    manifest, _ = _run(make_settings([{"name": "mm", "path": str(path)}]))
    assert manifest["sources"]["mm"]["read"] == 15
    assert manifest["sources"]["mm"]["kept"] == 15


def test_duplicates_keep_the_first_by_source_order_then_row_order(make_settings, tmp_path):
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    base = list(rows("metamathqa", 10, dup_share=0))
    write_json_array(a, base + [base[3]])
    write_json_array(b, base[:4])
    manifest, store = _run(
        make_settings([{"name": "a", "path": str(a)}, {"name": "b", "path": str(b)}])
    )
    assert manifest["sources"]["a"]["dropped"] == {"duplicate_within_source": 1}
    assert manifest["sources"]["a"]["drop_samples"]["duplicate_within_source"] == ["a:default:10"]
    assert manifest["sources"]["b"]["dropped"] == {"duplicate_across_sources": 4}
    assert {p["source"] for p in _all_prompts(store, manifest)} == {"a"}


def test_hermes_configs_sharing_prompts_are_deduplicated_across_sources(
    make_settings, sample_dir
) -> None:
    manifest, _ = _run(make_settings(_sample_sources(sample_dir)))
    single = manifest["sources"]["hermes_fc_singleturn"]
    assert single["kept"] == 0
    assert single["dropped"] == {"duplicate_across_sources": single["read"]}


def test_quota_is_a_seeded_sample_of_distinct_prompts(make_settings, tmp_path) -> None:
    path = tmp_path / "mm.json"
    write_json_array(path, list(rows("metamathqa", 100, dup_share=0.2)))
    src = [{"name": "mm", "path": str(path), "quota": 30}]
    m1, s1 = _run(make_settings(src, run_name="a", seed=1))
    m2, s2 = _run(make_settings(src, run_name="b", seed=1))
    m3, s3 = _run(make_settings(src, run_name="c", seed=2))
    funnel = m1["sources"]["mm"]
    assert funnel["kept"] == 30
    assert (
        funnel["dropped"]["over_quota"]
        == funnel["read"] - 30 - funnel["dropped"]["duplicate_within_source"]
    )
    ids = lambda m, s: sorted(p["id"] for p in _all_prompts(s, m))  # noqa: E731
    assert ids(m1, s1) == ids(m2, s2)
    assert ids(m1, s1) != ids(m3, s3)


def test_same_inputs_and_settings_give_byte_identical_shards(make_settings, sample_dir):
    src = _sample_sources(sample_dir)
    m1, s1 = _run(make_settings(src, run_name="one", shard_size=50))
    m2, s2 = _run(make_settings(src, run_name="two", shard_size=50))
    assert m1["shards"] == m2["shards"]
    for shard in m1["shards"]:
        assert s1.read(shard["key"]) == s2.read(shard["key"])
    assert s1.read(MANIFEST_KEY) == s2.read(MANIFEST_KEY)


def test_rerun_is_a_no_op_and_changed_settings_never_overwrite(make_settings, sample_dir):
    src = _sample_sources(sample_dir)
    m1, store = _run(make_settings(src, shard_size=50))
    before = {k: store.read(k) for k in store.list("")}
    m2, _ = _run(make_settings(src, shard_size=50))
    assert m1 == m2
    with pytest.raises(ObjectExistsError, match="new run_name"):
        _run(make_settings(src, shard_size=50, seed=9))
    assert {k: store.read(k) for k in store.list("")} == before


def test_language_and_source_filters(make_settings, tmp_path) -> None:
    ii = tmp_path / "ii.parquet"
    write_parquet(ii, list(rows("infinity_instruct", 200, dup_share=0)))
    manifest, store = _run(
        make_settings(
            [
                {"name": "ii", "path": str(ii), "languages": ["en"], "exclude_sources": ["flan"]},
            ]
        )
    )
    funnel = manifest["sources"]["ii"]
    assert funnel["dropped"]["filtered_language"] > 0
    assert funnel["dropped"]["filtered_source"] > 0
    kept = _all_prompts(store, manifest)
    assert all(p["metadata"]["langdetect"] == "en" for p in kept)
    assert all(p["metadata"]["source"] != "flan" for p in kept)


def test_filters_on_kinds_without_that_column_are_refused(make_settings, tmp_path) -> None:
    path = tmp_path / "mm.json"
    write_json_array(path, list(rows("metamathqa", 3)))
    with pytest.raises(SettingsError, match="has no language column"):
        _run(make_settings([{"name": "mm", "path": str(path), "languages": ["en"]}]))


def test_length_bounds_in_characters(make_settings, tmp_path) -> None:
    path = tmp_path / "mm.json"
    records = list(rows("metamathqa", 50, dup_share=0))
    write_json_array(path, records)
    manifest, store = _run(
        make_settings(
            [{"name": "mm", "path": str(path)}], min_prompt_length=40, max_prompt_length=200
        )
    )
    funnel = manifest["sources"]["mm"]
    lengths = [len(r["query"]) for r in records]
    assert funnel["dropped"].get("too_short", 0) == sum(n < 40 for n in lengths)
    assert funnel["dropped"].get("too_long", 0) == sum(n > 200 for n in lengths)
    assert all(40 <= len(p["messages"][0]["content"]) <= 200 for p in _all_prompts(store, manifest))


def test_dedupe_against_an_existing_prompt_set(make_settings, tmp_path) -> None:
    path = tmp_path / "mm.json"
    records = list(rows("metamathqa", 20, dup_share=0))
    write_json_array(path, records)
    existing = tmp_path / "completions" / "existing.jsonl"  # protected: read, never written
    existing.parent.mkdir()
    existing.write_text(
        "".join(
            json.dumps(
                {
                    "id": i,
                    "conversations": [
                        {"role": "user", "content": r["query"]},
                        {"role": "assistant", "content": "old"},
                    ],
                }
            )
            + "\n"
            for i, r in enumerate(records[:7])
        )
    )
    manifest, _ = _run(
        make_settings([{"name": "mm", "path": str(path)}], dedupe_against=[str(existing.parent)])
    )
    assert manifest["sources"]["mm"]["dropped"] == {"already_in_existing_set": 7}
    assert [p.name for p in existing.parent.iterdir()] == ["existing.jsonl"]


def test_more_shards_than_airflow_maps_at_once_are_prepared(make_settings, tmp_path):
    # How many of them one run maps is the plan's to check (include/prompts/plan.py).
    path = tmp_path / "mm.json"
    write_json_array(path, list(rows("metamathqa", 1100, dup_share=0)))
    manifest, _ = _run(make_settings([{"name": "mm", "path": str(path)}], shard_size=1))
    assert len(manifest["shards"]) == 1100


@pytest.mark.parametrize(
    ("setup", "error", "message"),
    [
        (lambda p: None, SourceReadError, "does not exist"),
        (lambda p: p.write_bytes(b"PAR1 not really parquet"), SourceReadError, "as parquet"),
        (lambda p: write_parquet(p, [{"prompt": "x"}]), UnknownLayoutError, "columns ['prompt']"),
    ],
)
def test_unreadable_sources_fail_with_the_source_named(
    make_settings, tmp_path, setup, error, message
) -> None:
    path = tmp_path / "broken.parquet"
    setup(path)
    with pytest.raises(error) as err:
        _run(make_settings([{"name": "broken", "path": str(path)}]))
    assert "'broken'" in str(err.value) and message in str(err.value)


def test_truncated_json_array_is_reported_not_guessed(make_settings, tmp_path) -> None:
    path = tmp_path / "mm.json"
    path.write_text('[{"query": "a", "response": "b", "type": "x"}, {"query": ')
    with pytest.raises((SourceReadError, PrepareError), match="truncated"):
        _run(make_settings([{"name": "mm", "path": str(path)}]))


def test_prompt_ids_are_source_config_and_row_id(make_settings, sample_dir) -> None:
    manifest, store = _run(make_settings(_sample_sources(sample_dir)))
    by_source = {p["source"]: p["id"] for p in _all_prompts(store, manifest)}
    assert by_source["infinity_instruct"].startswith("infinity_instruct:0625:")
    assert by_source["metamathqa"].startswith("metamathqa:default:")
    assert by_source["agentinstruct"].startswith("agentinstruct:os:os_")


def test_length_bounds_in_tokens_of_the_target_tokenizer(make_settings, tmp_path) -> None:
    from include.target_tokenizer import count_prompt_tokens, load_tokenizer
    from sglang_standin.tokenizer import build_chat_tokenizer

    tok_dir = build_chat_tokenizer(tmp_path / "tok")
    path = tmp_path / "mm.json"
    records = list(rows("metamathqa", 40, dup_share=0))
    write_json_array(path, records)
    manifest, store = _run(make_settings([{"name": "mm", "path": str(path)}],
                                         tokenizer_path=str(tok_dir), max_prompt_length=60))
    tokens = count_prompt_tokens(load_tokenizer(str(tok_dir)),
                                 [[{"role": "user", "content": r["query"]}] for r in records])
    assert manifest["length_unit"] == "tokens"
    assert manifest["sources"]["mm"]["dropped"].get("too_long", 0) == sum(n > 60 for n in tokens)
    assert 0 < manifest["sources"]["mm"]["kept"] < 40
