"""``check_settings`` of ``evaluate_drafter``: every refusal knowable before a server starts.

The form's values are checked by ``EvaluationRequest`` (drafters are names, never paths); the
dataset run is opened read-only under the deployment's ``output_root``; drafters resolve to
paths only through ``REGEN_ALLOWED_DRAFTERS``; the target's ``config.json`` is read from the
deployment's first allowed model when it is a local directory. Problems fail the task without
a retry (the same inputs give the same problems).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from include.pipeline.binding import fail_without_retry


class EvaluationRefused(ValueError):
    """The evaluation's settings, drafters or dataset run cannot be measured."""


def problems(params: Mapping[str, Any] | None) -> list[str]:
    """Return every problem of an evaluation trigger (empty: it may run)."""
    from pydantic import ValidationError

    from include.evaluation.checks import request_problems
    from include.evaluation.compat import read_config
    from include.evaluation.settings import EvaluationDeployment, EvaluationRequest
    from include.settings.deployment import DeploymentSettings
    from include.storage import open_store

    try:
        request = EvaluationRequest.model_validate(dict(params or {}))
    except ValidationError as exc:
        return [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    deployment = DeploymentSettings.load()
    store = open_store(f"{deployment.output_root}/{request.dataset_run}", read_only=True,
                       s3_conn_id=deployment.s3_conn_id)
    target = read_config(deployment.allowed_models[0])
    return request_problems(request, EvaluationDeployment(), store, target, read_config)


def run(params: Mapping[str, Any] | None) -> None:
    """The task: log the request and fail, without a retry, on any problem."""
    with fail_without_retry(EvaluationRefused):
        found = problems(params)
        if found:
            raise EvaluationRefused("evaluate_drafter refused:\n- " + "\n- ".join(found))
    print("evaluate_drafter: settings, drafters and the held-out split checked")
