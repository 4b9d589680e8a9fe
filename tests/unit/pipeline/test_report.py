"""The report task's dataset asset: valid for Airflow, and an event only for a run that passed
its gates."""

from __future__ import annotations

from airflow.sdk import Asset, AssetAlias
from airflow.sdk.execution_time.context import OutletEventAccessors

from include.pipeline.report import dataset_asset, emit_dataset_event
from include.reporting import DATASET_ALIAS, asset_event_extra, dataset_asset_uri
from include.settings import RunSettings
from tests.fixtures.settings import run_settings


def _settings(output_root: str, run_name: str = "expansion_v1") -> RunSettings:
    return run_settings({"run_name": run_name}, output_root=output_root)


def _summary(passed: bool) -> dict:
    return {"passed": passed, "report_uri": "s3://b/runs/expansion_v1/report/r/report.html",
            "run": {"run_name": "expansion_v1", "airflow_run_id": "r",
                    "outputs_uri": "s3://b/runs/expansion_v1"},
            "shards_produced": 3, "shards_reused": 1,
            "tokenized": {"written": 120, "tokens": 5000}}


def test_asset_is_valid_for_airflow_and_named_after_the_run() -> None:
    asset = dataset_asset(_settings("s3://bucket/runs"))
    assert isinstance(asset, Asset)
    assert asset.name == "drafter_data/expansion_v1"
    assert asset.uri == "s3://bucket/runs/expansion_v1/tokenized"


def test_a_passed_run_adds_one_event_to_the_alias_with_where_the_data_is() -> None:
    events = OutletEventAccessors()
    settings = _settings("s3://bucket/runs")
    assert emit_dataset_event(events, settings, _summary(True))
    alias_events = events[AssetAlias(DATASET_ALIAS)].asset_alias_events
    assert len(alias_events) == 1
    event = alias_events[0]
    assert event.dest_asset_key.uri == dataset_asset_uri(settings)
    assert event.extra == asset_event_extra(_summary(True))
    assert event.extra["outputs_uri"] == "s3://b/runs/expansion_v1"


def test_a_failed_run_adds_no_event() -> None:
    events = OutletEventAccessors()
    assert not emit_dataset_event(events, _settings("s3://bucket/runs"), _summary(False))
    assert events[AssetAlias(DATASET_ALIAS)].asset_alias_events == []
