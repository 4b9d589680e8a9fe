"""The report and the monitor find files by ``include.layout``'s keys, not their own strings."""

from __future__ import annotations

from include.layout import (
    REPORT_HTML,
    REPORT_JSON,
    compacted_keys,
    journal_prefix,
    lease_key,
    regeneration_prefix,
    report_prefix,
    started_key,
)
from include.monitor.runs import is_report_file
from include.monitor.states import summarize_run


def test_the_monitor_serves_exactly_the_report_files_the_layout_names() -> None:
    for base in ("run", f"run/{regeneration_prefix('manual__2026-01-01T00:00:00+00:00')}"):
        assert is_report_file(f"{base}/{report_prefix('r1')}{REPORT_JSON}")
        assert is_report_file(f"{base}/{report_prefix('r1')}{REPORT_HTML}")
        assert not is_report_file(f"{base}/{started_key('shard-00000')}")
    # A regeneration whose folder is named "report" holds journals, not a report.
    assert not is_report_file(f"run/{regeneration_prefix('report')}/{journal_prefix('x')}/a.json")


def test_journal_and_lease_keys_sit_under_the_shards_journal_prefix() -> None:
    prefix = journal_prefix("shard-00003")
    assert prefix == "journal/shard-00003"
    assert started_key("shard-00003") == f"{prefix}/started"
    assert lease_key(prefix, 3) == f"{prefix}/lease/00000003.json"
    # Beside the folder, not in it: readers of every key under the prefix see segments only.
    assert all(not k.startswith(prefix + "/") for k in compacted_keys(prefix))


def test_airflow_runs_attach_a_forced_regeneration_to_its_layout_location() -> None:
    run_id = "manual__2026-01-01T00:00:00+00:00"
    plan = [{"shard_id": "shard-00000", "outputs_uri": f"/out/r/{regeneration_prefix(run_id)}"}]
    summary = summarize_run("dag", {"run_id": run_id, "state": "running", "conf": {},
                                    "start_date": None}, [], plan)
    assert summary["location"] == regeneration_prefix(run_id)
