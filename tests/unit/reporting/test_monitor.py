"""Run states for the monitor page, from a synthetic run's files."""

from __future__ import annotations

from include.reporting.monitor import RunMonitor
from include.storage import LocalStore
from tests.fixtures.settings import run_settings
from tests.unit.reporting.synthetic_run import T0, ShardSpec, write_prompts_manifest, write_shard


def test_done_running_and_left_shards_with_rows_rate_and_eta(tmp_path) -> None:
    run = LocalStore(tmp_path / "syn")
    shards = {"shard-00000": ShardSpec(completed=8, skipped=1, failed=1),
              "shard-00001": ShardSpec(completed=6, journal_only=True),
              "shard-00002": ShardSpec(completed=10)}
    write_prompts_manifest(run, shards)
    write_shard(run, "shard-00000", shards["shard-00000"])
    # Shard 1 is generating: its journal holds 6 finished prompts (T0+1..T0+6), no manifest.
    spec = ShardSpec(completed=6, journal_only=True)
    write_shard(run, "shard-00001", spec)
    monitor = RunMonitor(LocalStore(tmp_path))
    assert monitor.run_names() == ["syn"]
    state = monitor.run_state("syn", now=T0 + 60, probe=False)
    loc = state["locations"][0]
    assert (loc["shards_done"], loc["shards_running"], loc["shards_left"]) == (1, 1, 1)
    assert loc["rows"] == {"completed": 14, "skipped": 1, "failed": 1}
    # Shard 1 holds 6 prompts and all 6 are finished; shard 2's 10 are left.
    assert loc["remaining_prompts"] == 10
    assert loc["tokens_per_s"] == round(sum(100 + i for i in range(6)) / 120, 1)
    assert loc["eta_s"] == round(10 / (6 / 120))
    assert {s["url"] for s in loc["servers"]} == {"http://s0:1", "http://s1:1"}


def test_a_forced_regeneration_is_its_own_location_and_reports_are_linked(tmp_path) -> None:
    from include.reporting import QualityGates, build_report

    shards = {"shard-00000": ShardSpec(completed=4)}
    run = LocalStore(tmp_path / "syn")
    write_prompts_manifest(run, shards)
    regen = LocalStore(tmp_path / "syn" / "regenerations" / "manual_1")
    write_shard(regen, "shard-00000", shards["shard-00000"])
    settings = run_settings({"output_uri": str(tmp_path), "run_name": "syn"})
    build_report(settings, run, regen, ["shard-00000"], [], run_id="manual_1",
                 gates=QualityGates(max_quarantine_rate=1), plots=False)
    state = RunMonitor(LocalStore(tmp_path)).run_state("syn", now=T0, probe=False)
    main, forced = state["locations"]
    assert main["location"] == "." and main["shards_done"] == 0 and main["shards_left"] == 1
    assert forced["location"] == "regenerations/manual_1" and forced["shards_done"] == 1
    assert forced["reports"] == [{"airflow_run_id": "manual_1", "passed": True,
                                  "key": "syn/regenerations/manual_1/report/manual_1/"
                                         "report.html"}]
