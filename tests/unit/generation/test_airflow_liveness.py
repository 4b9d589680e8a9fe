"""Whether another run may still publish a shard, asked of Airflow: unknown counts as live.

Only ``airflow_run_is_live`` is imported (it predates the lease), so the error case fails on
the code before issue 18 by its answer, not by an import."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from include.pipeline import airflow_state
from include.pipeline.airflow_state import airflow_run_is_live


def _airflow_answering(monkeypatch, answer) -> None:
    """Stand in for the task SDK's ``RuntimeTaskInstance.get_dagrun_state``."""

    class RuntimeTaskInstance:
        @staticmethod
        def get_dagrun_state(dag_id, run_id):
            if isinstance(answer, Exception):
                raise answer
            return answer

    module = types.ModuleType("airflow.sdk.execution_time.task_runner")
    module.RuntimeTaskInstance = RuntimeTaskInstance  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "airflow.sdk.execution_time.task_runner", module)


class _ApiError(Exception):
    """Shaped like the task SDK's AirflowRuntimeError(ErrorResponse(API_SERVER_ERROR))."""

    def __init__(self, status: int) -> None:
        self.error = types.SimpleNamespace(detail={"status_code": status})
        super().__init__(f"API_SERVER_ERROR: {status}")


@pytest.mark.parametrize(("answer", "live"), [
    ("running", True), ("queued", True), ("success", False), ("failed", False),
    (ConnectionError("api-server down"), True),  # before: False, and a second writer
    (TimeoutError("timed out"), True),
    (_ApiError(500), True),
    (_ApiError(404), False),  # the run was deleted: nothing of it can publish
])
def test_an_airflow_api_error_counts_the_run_as_live(monkeypatch, caplog, answer,
                                                     live) -> None:
    _airflow_answering(monkeypatch, answer)
    with caplog.at_level(logging.INFO, logger=airflow_state.log.name):
        assert airflow_run_is_live("dag")("run-1") is live
    if isinstance(answer, ConnectionError):
        assert "state unknown (api-server down); counting it as live" in caplog.text
