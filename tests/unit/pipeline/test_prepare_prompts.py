"""The prepare_prompts task's plan: reuse prepared shards, shard ranges, a staggered first wave,
and Airflow's map limit named with the ranges to run instead."""

from __future__ import annotations

import pytest

from include.layout import EVAL_PROMPTS_KEY, EVAL_SHARD, MANIFEST_KEY, shard_id
from include.pipeline.binding import outputs_uri, shard_locations, trusted_outputs_uri
from include.pipeline.prepare_prompts import check_map_length, plan_run, stagger
from include.servers.launch_report import XComMismatchError
from include.settings import RunSettings, SettingsError
from include.storage import LocalStore
from tests.fixtures.settings import run_settings


def test_first_wave_is_staggered_and_later_shards_are_not() -> None:
    ids = [f"shard-{i:05d}" for i in range(6)]
    assert stagger(ids, 3) == [
        None,
        {"shard_id": "shard-00000", "fraction": 0.3333},
        {"shard_id": "shard-00000", "fraction": 0.6667},
        None,
        None,
        None,
    ]
    assert stagger(ids, 1) == [None] * 6
    assert stagger([], 3) == []


def _changed(settings: RunSettings, **changes) -> RunSettings:
    """Return ``settings`` with run settings changed, on the same deployment."""
    return RunSettings.from_mapping({**settings.to_dict(), **changes}, settings.deployment)


@pytest.fixture
def settings(tmp_path) -> RunSettings:
    return run_settings({"run_name": "r", "shard_size": 60}, output_root=str(tmp_path))


def test_plan_reuses_shards_prepared_with_the_same_settings(settings, caplog) -> None:
    first = plan_run(settings, "run-1", 3)
    store = LocalStore(settings.run_uri)
    before = store.read(MANIFEST_KEY)
    again = plan_run(settings, "run-2", 3)
    assert [p["shard_id"] for p in again] == [p["shard_id"] for p in first]
    assert store.read(MANIFEST_KEY) == before
    assert first[1]["wait_for"] == {"shard_id": first[0]["shard_id"], "fraction": 0.3333}


def test_shard_range_skips_complete_shards_and_force_goes_elsewhere(settings) -> None:
    plan_run(settings, "run-1")
    store = LocalStore(settings.run_uri)
    store.write_new("tokenized/shard-00001.manifest.json", b"{}")
    ranged = _changed(settings, shard_range="0-2")
    assert [p["shard_id"] for p in plan_run(ranged, "run-2")] == ["shard-00000", "shard-00002"]
    forced = _changed(ranged, force_regenerate=True)
    plan = plan_run(forced, "manual__2026-11-30T01:00:00+00:00")
    assert [p["shard_id"] for p in plan] == ["shard-00000", "shard-00001", "shard-00002"]
    assert plan[0]["outputs_uri"] == outputs_uri(forced, "manual__2026-11-30T01:00:00+00:00")
    assert "/regenerations/manual__2026-11-30T01_00_00_00_00" in plan[0]["outputs_uri"]
    # What the plan says is what the shard tasks rebuild (spelled any way), and nothing else.
    run_id = "manual__2026-11-30T01:00:00+00:00"
    for given in (plan[0]["outputs_uri"], plan[0]["outputs_uri"] + "/"):
        assert trusted_outputs_uri(forced, run_id, given) == plan[0]["outputs_uri"]
    for given in (settings.run_uri, plan[0]["outputs_uri"] + "/..", "s3:/x", None):
        with pytest.raises(XComMismatchError, match="not this run's output location"):
            trusted_outputs_uri(forced, run_id, given)
    too_far = _changed(settings, shard_range="0-99")
    with pytest.raises(SettingsError, match="outside the"):
        plan_run(too_far, "run-3")


def test_a_plan_past_the_map_limit_says_which_shard_ranges_to_run(settings) -> None:
    todo = [shard_id(n) for n in range(3, 1703)]
    with pytest.raises(SettingsError) as err:
        check_map_length(settings, todo, 1703, limit=1024)
    text = str(err.value)
    assert "1700 of the 1703 shards" in text and "core.max_map_length = 1024" in text
    assert "shard_range '3-1026', then '1027-1702'" in text
    assert "AIRFLOW__CORE__MAX_MAP_LENGTH to at least 1700" in text
    check_map_length(settings, todo[:1024], 1703, limit=1024)  # at the limit: fine


def test_a_run_with_every_shard_complete_says_there_is_nothing_to_do(settings, tmp_path,
                                                                     caplog) -> None:
    """Issue 34, item 6: re-triggered with the same run_name and every shard complete, the
    run said nothing and ended green; check_settings and prepare_prompts now say why, and
    the sentence is handed on for the run's note."""
    from include.pipeline.check_settings import check_settings

    first = plan_run(settings, "run-1")
    store = LocalStore(settings.run_uri)
    told: list[str] = []
    assert plan_run(settings, "run-2", say=told.append) == first and told == []  # work left
    for entry in first:
        store.write_new(f"tokenized/{entry['shard_id']}.manifest.json", b"{}")
    caplog.set_level("WARNING")
    assert plan_run(settings, "run-3", say=told.append) == []
    n = len(first)
    assert told == [f"nothing to do: {n} of {n} shards already complete under run_name 'r' "
                    f"({settings.run_uri}); to make a new run, trigger with a new run_name, or "
                    "with force_regenerate: true to generate these shards again in a new folder"]
    assert told[0] in caplog.text
    caplog.clear()
    check_settings(settings.to_dict(), settings.deployment)
    assert f"nothing to do: {n} of {n} shards already complete" in caplog.text
    caplog.clear()
    check_settings({**settings.to_dict(), "force_regenerate": True}, settings.deployment)
    assert "nothing to do" not in caplog.text  # a new folder: every shard runs


def test_the_run_location_is_opened_and_logged_once(settings, caplog) -> None:
    """Issue 34, item 8: prepare_prompts (and report) opened the run's location twice, once
    for the prompts and once for the outputs, logging the location and credentials twice."""
    caplog.set_level("INFO", logger="include.storage")
    plan_run(settings, "run-1")
    opened = [r.getMessage() for r in caplog.records if r.getMessage().startswith(
        "output location ")]
    assert len(opened) == 1, opened
    caplog.clear()
    plan_run(_changed(settings, force_regenerate=True), "manual__2")  # two locations: two lines
    assert len([r for r in caplog.records if r.getMessage().startswith("output location ")]) == 2


def test_a_whole_run_answers_its_held_out_split_last_and_once(settings, caplog) -> None:
    """Issue 36, item 1: the held-out split is planned after the shards, as the shard of the
    run's eval/ folder, until its rows are tokenized; a shard_range backfill leaves it."""
    held = _changed(settings, held_out_per_source=2)
    plan = plan_run(held, "run-1")
    *shards, last = plan
    assert last == {"shard_id": EVAL_SHARD, "outputs_uri": held.run_uri, "wait_for": None,
                    "split": "held_out"}
    assert shards and all(p["split"] == "train" for p in shards)
    assert LocalStore(held.run_uri).exists(EVAL_PROMPTS_KEY)
    assert shard_locations(held, held.run_uri, "held_out") == (
        f"{held.run_uri}/eval", f"{held.run_uri}/eval")
    assert all(p["split"] == "train" for p in plan_run(_changed(held, shard_range="0-1"), "r2"))
    store = LocalStore(held.run_uri)
    for entry in shards:
        store.write_new(f"tokenized/{entry['shard_id']}.manifest.json", b"{}")
    told: list[str] = []
    assert plan_run(held, "run-3", say=told.append) == [last] and told == []  # not idle yet
    store.write_new(f"eval/tokenized/{EVAL_SHARD}.manifest.json", b"{}")
    assert plan_run(held, "run-4", say=told.append) == [] and told  # now nothing to do


def test_a_split_edited_in_xcom_is_refused(settings) -> None:
    with pytest.raises(XComMismatchError, match="split 'eval/../../x'"):
        shard_locations(settings, settings.run_uri, "eval/../../x")
