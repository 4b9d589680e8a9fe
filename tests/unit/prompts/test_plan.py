"""Run planning: reuse or refuse existing prompt shards, shard ranges, staggered first wave."""

from __future__ import annotations

import json
import threading
import time

import pytest

from include.generation.shard import wait_for_progress
from include.layout import journal_prefix, started_key
from include.pipeline.plan import plan_run, stagger
from include.pipeline.run import open_run_store, outputs_uri
from include.prompts import MANIFEST_KEY, PrepareError
from include.prompts.plan import prepare_or_reuse
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
    return run_settings(
        {"output_uri": str(tmp_path), "run_name": "r", "shard_size": 60}
    )


def test_plan_reuses_shards_prepared_with_the_same_settings(settings, caplog) -> None:
    first = plan_run(settings, "run-1", 3)
    store = LocalStore(settings.run_uri)
    before = store.read(MANIFEST_KEY)
    again = plan_run(settings, "run-2", 3)
    assert [p["shard_id"] for p in again] == [p["shard_id"] for p in first]
    assert store.read(MANIFEST_KEY) == before
    assert first[1]["wait_for"] == {"shard_id": first[0]["shard_id"], "fraction": 0.3333}


def test_plan_refuses_shards_prepared_with_other_settings(settings) -> None:
    prepare_or_reuse(settings, open_run_store(settings))
    other = _changed(settings, seed=5)
    with pytest.raises(PrepareError, match=r"different: \['seed'\]"):
        prepare_or_reuse(other, open_run_store(other))


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
    too_far = _changed(settings, shard_range="0-99")
    with pytest.raises(SettingsError, match="outside the"):
        plan_run(too_far, "run-3")


def test_a_staggered_shard_starts_when_the_leader_reaches_its_fraction(settings) -> None:
    plan = plan_run(settings, "run-1", 2)
    store = LocalStore(settings.run_uri)
    leader = plan[0]["shard_id"]
    size = json.loads(store.read(MANIFEST_KEY))["shards"][0]["count"]
    started = threading.Event()

    def follower() -> None:
        wait_for_progress(store, store, plan[1]["shard_id"], leader, 0.5, poll_s=0.05)
        started.set()

    store.write_new(started_key(leader), b"")
    threading.Thread(target=follower, daemon=True).start()
    lines = [json.dumps({"id": f"x{i}", "status": "completed"}) for i in range(size // 2 - 1)]
    store.write_new(f"{journal_prefix(leader)}/part-1.jsonl", ("\n".join(lines) + "\n").encode())
    time.sleep(0.3)
    assert not started.is_set()  # one prompt short of half
    store.write_new(
        f"{journal_prefix(leader)}/part-2.jsonl", b'{"id": "last", "status": "completed"}\n'
    )
    assert started.wait(5)


def test_a_follower_never_waits_long_for_a_leader_that_is_not_running(settings) -> None:
    plan = plan_run(settings, "run-1", 2)
    store = LocalStore(settings.run_uri)
    leader, follower = plan[0]["shard_id"], plan[1]["shard_id"]
    t0 = time.monotonic()  # not started (a one-slot executor runs the follower first)
    wait_for_progress(store, store, follower, leader, 0.5, start_grace_s=0.3, poll_s=0.05)
    assert time.monotonic() - t0 < 3
    store.write_new(started_key(leader), b"")  # started, then stalled
    t0 = time.monotonic()
    wait_for_progress(store, store, follower, leader, 0.5, stall_s=0.3, poll_s=0.05)
    assert time.monotonic() - t0 < 3


def test_a_plan_past_the_map_limit_says_which_shard_ranges_to_run(settings) -> None:
    from include.pipeline.plan import check_map_length
    from include.prompts.prepare import shard_id

    todo = [shard_id(n) for n in range(3, 1703)]
    with pytest.raises(SettingsError) as err:
        check_map_length(settings, todo, 1703, limit=1024)
    text = str(err.value)
    assert "1700 of the 1703 shards" in text and "core.max_map_length = 1024" in text
    assert "shard_range '3-1026', then '1027-1702'" in text
    assert "AIRFLOW__CORE__MAX_MAP_LENGTH to at least 1700" in text
    check_map_length(settings, todo[:1024], 1703, limit=1024)  # at the limit: fine
