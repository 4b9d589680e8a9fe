"""``check_settings`` of ``evaluate_drafter``: every refusal knowable before a server starts.

The form's values are checked by ``EvaluationRequest`` (drafters are names, never paths) and
the servers' settings by ``RunSettings`` (an allowed model); the dataset run (the form's, or
the dataset Asset's latest) is opened read-only under the deployment's ``output_root``;
drafters resolve to paths only through the deployment's ``allowed_drafters``
(``REGEN_ALLOWED_DRAFTERS``) and are fitted to the target's ``config.json`` (read from the
servers' ``model_path`` when it is a local directory); named prompt sets resolve to files only
through ``allowed_prompt_sets`` (``REGEN_ALLOWED_PROMPT_SETS``), inside the data roots, and are
read whole; the deployment must have a server per configuration. Problems fail the task
without a retry (the same inputs give the same problems).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from include.pipeline.binding import fail_without_retry


class EvaluationRefused(ValueError):
    """The evaluation's settings, drafters or dataset run cannot be measured."""


def latest_dataset_run(inlet_events: Any) -> str | None:
    """The run name of the dataset Asset's latest event (the main DAG's passed report)."""
    if inlet_events is None:
        return None
    from airflow.sdk import AssetAlias

    from include.reporting.asset import DATASET_ALIAS

    events = inlet_events[AssetAlias(DATASET_ALIAS)]
    if not len(events):
        return None
    return (events[-1].extra or {}).get("run_name")


def problems(params: Mapping[str, Any] | None, inlet_events: Any = None
             ) -> tuple[list[str], list[dict[str, Any]]]:
    """Return every problem of an evaluation trigger (empty: it may run) and what it runs."""
    from pydantic import ValidationError

    from include.evaluation.binding import dataset_uri, server_settings
    from include.evaluation.checks import request_problems
    from include.evaluation.compat import read_config
    from include.evaluation.passes import PassPlanError, configurations, plan_passes
    from include.evaluation.settings import EvaluationRequest
    from include.servers.commands import server_specs
    from include.settings.errors import SettingsError
    from include.storage import open_store

    try:
        request = EvaluationRequest.from_params(params)
    except ValidationError as exc:
        return [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()], []
    try:
        settings = server_settings(request)
    except SettingsError as exc:
        return [str(exc)], []
    deployment = settings.deployment
    dataset_run = request.dataset_run or latest_dataset_run(inlet_events)
    if not dataset_run:
        return ["dataset_run is empty and the dataset Asset has no event yet: name a run"], []
    found: list[str] = []
    try:
        plan_passes(request, deployment.allowed_drafters, server_specs(settings))
    except PassPlanError as exc:
        found.append(str(exc))
    except KeyError:
        pass  # a drafter the deployment does not list: request_problems says which
    store = open_store(dataset_uri(deployment, dataset_run), read_only=True,
                       s3_conn_id=deployment.s3_conn_id)
    found += request_problems(request, deployment.allowed_drafters, store,
                              read_config(settings.model_path), read_config,
                              allowed_sets=deployment.allowed_prompt_sets,
                              data_roots=deployment.data_roots)
    return found, [{"config": c, "dataset_run": dataset_run} for c in configurations(request)]


def run(params: Mapping[str, Any] | None, inlet_events: Any = None) -> list[dict[str, Any]]:
    """The task: fail, without a retry, on any problem; one ``{"config", "dataset_run"}`` per
    configuration (what ``measure`` is mapped over)."""
    with fail_without_retry(EvaluationRefused):
        found, plan = problems(params, inlet_events)
        if found:
            raise EvaluationRefused("evaluate_drafter refused:\n- " + "\n- ".join(found))
    print(f"evaluate_drafter: dataset run {plan[0]['dataset_run']!r}, configurations "
          f"{[p['config'] for p in plan]}: settings, drafters, the held-out split and the "
          "named prompt sets checked")
    return plan
