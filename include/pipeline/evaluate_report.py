"""``report`` and ``gate`` of ``evaluate_drafter``: the figures, files, Asset event and gate.

The report reads every configuration's journal, writes ``report.md``, the plot,
``report.json`` and the card's "measured value" section create-only under
``<dataset run>/eval/evaluations/<run id>/``, and attaches an event for the dataset run's
evaluations to the ``keys.EVALUATION_ALIAS`` outlet (a promotion DAG can be scheduled on it; its
extra carries the gains and whether the gate passed). The gate then fails the run, without a
retry, when a candidate gains less than ``min_gain`` over the baseline, naming the figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from include.pipeline.binding import fail_without_retry


class GainTooSmall(ValueError):
    """A candidate's measured gain over the baseline is below ``min_gain``."""


def run(checked: list[dict[str, Any]], params: Mapping[str, Any] | None, run_id: str | None,
        outlet_events: Any = None) -> dict[str, Any]:
    """The report task: write the report files, emit the Asset event; return report.json."""
    from include.durability.journal import StoreJournal
    from include.evaluation.binding import bind_evaluation, dataset_uri
    from include.evaluation.keys import EVALUATION_ALIAS, EVALUATIONS_PREFIX, journal_prefix
    from include.evaluation.outcome import build, gate_problems
    from include.evaluation.passes import configurations
    from include.storage import open_store

    request, settings, _ = bind_evaluation(params)
    deployment = settings.deployment
    dataset_run = checked[0]["dataset_run"]  # one run for every configuration
    uri = dataset_uri(deployment, dataset_run)
    store = open_store(uri, s3_conn_id=deployment.s3_conn_id,
                       protected_prefixes=tuple(deployment.protected_prefixes))
    records: dict[str, dict[str, Any]] = {}
    for config in configurations(request):
        records.update(StoreJournal(store, journal_prefix(run_id or "manual", config)).load())
    outcome = build(store, records, request, dataset_run, run_id or "manual")
    data = outcome.data
    print(f"evaluation of {dataset_run}: {data['report_uri']}")
    for g in outcome.gains:
        print(f"  {g['candidate']} over {g['baseline']} (thinking "
              f"{'on' if g['thinking'] else 'off'}, T={g['temperature']:g}): "
              f"{g['gain']:+.3f} [{g['low']:+.3f}, {g['high']:+.3f}] acceptance length")
    if outlet_events is not None:
        from airflow.sdk import Asset, AssetAlias

        extra = {k: data[k] for k in ("dataset_run", "evaluation_id", "report_uri",
                                      "baseline", "candidates", "gains", "min_gain")}
        extra["gate_passed"] = not gate_problems(outcome.gains, request.min_gain)
        outlet_events[AssetAlias(EVALUATION_ALIAS)].add(
            Asset(name=f"drafter_evaluation/{dataset_run}",
                  uri=f"{_asset_base(uri)}/{EVALUATIONS_PREFIX}"), extra=extra)
    return {k: data[k] for k in ("dataset_run", "evaluation_id", "report_uri", "gains",
                                 "min_gain", "candidates")}


def _asset_base(uri: str) -> str:
    import os

    return uri.rstrip("/") if uri.startswith("s3://") else "file://" + os.path.abspath(uri)


def gate(summary: dict[str, Any], params: Mapping[str, Any] | None) -> None:
    """The gate task: fail, naming the figures, when a candidate's gain is below min_gain.

    ``min_gain`` is the form's (rebuilt from the params); the gains are the report's.
    """
    from include.evaluation.outcome import gate_problems
    from include.evaluation.settings import EvaluationRequest

    request = EvaluationRequest.from_params(params)
    if request.min_gain is None:
        print("no min_gain set: no gate")
        return
    with fail_without_retry(GainTooSmall):
        found = gate_problems(summary.get("gains") or [], request.min_gain,
                              request.candidate_names)
        if found:
            raise GainTooSmall("min_gain gate failed:\n- " + "\n- ".join(found))
    print(f"min_gain {request.min_gain:+.3f}: every candidate passed")
