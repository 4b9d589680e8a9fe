"""Run reports, quality gates, the dataset asset, and run state for the monitor page."""

from include.reporting.asset import (
    DATASET_ALIAS,
    asset_event_extra,
    dataset_asset,
    dataset_asset_uri,
    emit_dataset_event,
)
from include.reporting.gates import QualityGateError, QualityGates, raise_for_gates
from include.reporting.report import build_report, format_summary, report_prefix

__all__ = [
    "DATASET_ALIAS",
    "QualityGateError",
    "QualityGates",
    "asset_event_extra",
    "build_report",
    "dataset_asset",
    "dataset_asset_uri",
    "emit_dataset_event",
    "format_summary",
    "raise_for_gates",
    "report_prefix",
]
