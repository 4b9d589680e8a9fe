"""The evaluation's settings bound to the deployment: its servers' ``RunSettings``, its passes.

Every task rebuilds them from the run's params and the worker's environment (never XCom), as
``include.pipeline.binding.bind`` does for the main DAG.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from include.evaluation.passes import Pass, plan_passes
from include.evaluation.settings import EvaluationRequest
from include.servers.commands import server_specs
from include.settings import RunSettings


def server_settings(request: EvaluationRequest, deployment: Any = None) -> RunSettings:
    """The run settings the evaluation's servers are launched and gated with."""
    values: dict[str, Any] = dict(request.server_values())
    if request.dataset_run:
        values["run_name"] = request.dataset_run
    return RunSettings.from_mapping(values, deployment)


def bind_evaluation(params: Mapping[str, Any] | None
                    ) -> tuple[EvaluationRequest, RunSettings, list[Pass]]:
    """The request, its servers' settings and its passes (raise on a refused value)."""
    request = EvaluationRequest.from_params(params)
    settings = server_settings(request)
    passes = plan_passes(request, settings.deployment.allowed_drafters, server_specs(settings))
    return request, settings, passes


def dataset_uri(deployment: Any, dataset_run: Any) -> str:
    """The dataset run's location under the deployment's ``output_root``.

    ``dataset_run`` is the form's, or the one the check step resolved from the dataset
    Asset's latest event (XCom): either way only a name of the run-name pattern is accepted,
    so no value reaches a location outside the output root.
    """
    import re

    from include.evaluation.settings import RUN_PATTERN

    if not isinstance(dataset_run, str) or not re.match(RUN_PATTERN, dataset_run):
        raise ValueError(f"dataset run {str(dataset_run)[:80]!r} is not a run name "
                         "(letters, digits, '.', '_', '-')")
    return deployment.output_root.rstrip("/") + "/" + dataset_run
