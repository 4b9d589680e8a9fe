"""``report``: the run's report, its quality gates, and the dataset asset's event.

The reporting stage builds the report from the run's files; this task says which shards the
run produced and reused, reads the launch report back through the settings (the report shows
no edited XCom fact), fails on a broken gate, and otherwise attaches the finished dataset's
Asset event to the ``DATASET_ALIAS`` outlet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from include.layout import MANIFEST_KEY, Split, shard_id
from include.pipeline.binding import bind, fail_without_retry, open_outputs_store, open_run_store
from include.reporting.asset import (
    DATASET_ALIAS,
    asset_event_extra,
    dataset_asset_name,
    dataset_asset_uri,
)
from include.settings import RunSettings


def report_run(settings: RunSettings, produced: list[str], run_id: str,
               launch: dict[str, Any] | None = None, *,
               settings_fingerprint: str | None = None) -> dict[str, Any]:
    """Write the report of a DAG run whose shard group produced ``produced``; return its summary
    (``include.reporting.build.build_report``'s).

    Shards the run's ``shard_range`` selects but did not produce are reported as reused;
    without ``settings_fingerprint``, the one the shards' generated manifests agree on.
    """
    from include.reporting.build import build_report
    from include.reporting.collect import read_json

    run_store = open_run_store(settings)
    manifest = read_json(run_store, MANIFEST_KEY)
    if manifest is None:
        raise FileNotFoundError(f"{run_store.uri(MANIFEST_KEY)} does not exist")
    selected = [shard_id(n) for n in settings.shard_numbers(len(manifest["shards"]))
                if manifest["shards"][n]["count"]]
    done = set(produced)
    reused = [s for s in selected if s not in done]
    outputs = open_outputs_store(settings, run_id, run_store)
    return build_report(settings, run_store, outputs, produced, reused, run_id=run_id,
                        launch=launch, settings_fingerprint=settings_fingerprint)


def dataset_asset(settings: Any) -> Any:
    """Return the ``airflow.sdk.Asset`` of a run's finished dataset."""
    from airflow.sdk import Asset

    return Asset(name=dataset_asset_name(settings), uri=dataset_asset_uri(settings))


def emit_dataset_event(outlet_events: Any, settings: Any, summary: dict[str, Any]) -> bool:
    """Attach the dataset's asset event to the ``DATASET_ALIAS`` outlet if the run passed.

    ``outlet_events`` is the task context's ``outlet_events``. Returns False (and attaches
    nothing) when the summary did not pass its gates.
    """
    if not summary.get("passed"):
        return False
    from airflow.sdk import AssetAlias

    outlet_events[AssetAlias(DATASET_ALIAS)].add(dataset_asset(settings),
                                                 extra=asset_event_extra(summary))
    return True


def run(plan: list[dict[str, Any]], launched: dict[str, Any] | None,
        params: Mapping[str, Any] | None, run_id: str | None,
        outlet_events: Any) -> dict[str, Any]:
    """The report task: write the report; fail (no retry) on a broken quality gate, else
    update the dataset asset; return the summary."""
    from include.reporting.gates import QualityGateError, raise_for_gates
    from include.servers.launch_report import LaunchReport, XComMismatchError

    settings = bind(params)
    if launched:  # read back through the settings: the report shows no edited XCom fact
        with fail_without_retry(XComMismatchError):
            launched = LaunchReport.from_dict(launched, settings).to_dict()
    produced = [p["shard_id"] for p in plan if p.get("split", Split.TRAIN) == Split.TRAIN]
    summary = report_run(settings, produced, run_id or "manual", launched)
    # The same files give the same verdict: retrying cannot help.
    with fail_without_retry(QualityGateError):
        raise_for_gates(summary)
    emit_dataset_event(outlet_events, settings, summary)
    return summary
