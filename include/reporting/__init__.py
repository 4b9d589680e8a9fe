"""Run reports, quality gates, the dataset asset's names, and run state for the monitor page.

Names are loaded on first use, so that the DAG file can import the asset alias at parse
time without pulling in the report's readers (storage, generation, plotting).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DATASET_ALIAS": "include.reporting.asset",
    "asset_event_extra": "include.reporting.asset",
    "dataset_asset_name": "include.reporting.asset",
    "dataset_asset_uri": "include.reporting.asset",
    "QualityGateError": "include.reporting.gates",
    "QualityGates": "include.reporting.gates",
    "raise_for_gates": "include.reporting.gates",
    "build_report": "include.reporting.build",
    "format_summary": "include.reporting.build",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'include.reporting' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
