"""Airflow's REST API as a user calls it: a token from ``POST /auth/token``, then ``/api/v2``.

Used by the native tier's launcher (is the DAG loaded?) and by the deployment tests, which
trigger and follow runs exactly the way README.md tells a user to.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import requests


def unix_time(timestamp: str | None) -> float:
    """Return a time the API answered (ISO 8601) as Unix time; 0 for none."""
    from datetime import datetime

    if not timestamp:
        return 0.0
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


class ApiError(RuntimeError):
    """An API call answered with an unexpected status; the message quotes the answer."""


@dataclass
class AirflowApi:
    """A logged-in client of one Airflow API server."""

    url: str
    username: str
    password: str
    _session: requests.Session = field(default_factory=requests.Session, repr=False)

    def login(self) -> AirflowApi:
        answer = self._session.post(f"{self.url}/auth/token", timeout=30,
                                    json={"username": self.username, "password": self.password})
        if answer.status_code not in (200, 201):
            raise ApiError(f"POST /auth/token as {self.username!r}: {answer.status_code} "
                           f"{answer.text[:300]}")
        self._session.headers["Authorization"] = f"Bearer {answer.json()['access_token']}"
        return self

    def call(self, method: str, path: str, expect: tuple[int, ...] = (200,),
             **kwargs: Any) -> Any:
        """Call ``/api/v2<path>``; return the JSON answer (None when it has no body)."""
        answer = self._session.request(method, f"{self.url}/api/v2{path}", timeout=30, **kwargs)
        if answer.status_code == 401 and "Authorization" in self._session.headers:
            self.login()  # the token expired: log in again, once
            answer = self._session.request(method, f"{self.url}/api/v2{path}", timeout=30,
                                           **kwargs)
        if answer.status_code not in expect:
            raise ApiError(f"{method} /api/v2{path}: {answer.status_code} {answer.text[:500]}")
        return answer.json() if answer.content else None

    def import_errors(self) -> list[str]:
        errors = self.call("GET", "/importErrors")["import_errors"]
        return [f"{e['filename']}: {e['stack_trace'].strip()}" for e in errors]

    def wait_for_dag(self, dag_id: str, timeout: float = 180.0) -> dict[str, Any]:
        """Return the DAG once the dag-processor has loaded it; raise ApiError with the
        import errors if it does not appear in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return self.call("GET", f"/dags/{dag_id}")
            except ApiError as exc:
                if " 404 " not in str(exc):
                    raise
            time.sleep(1.0)
        errors = self.import_errors()
        raise ApiError(f"DAG {dag_id} not loaded after {timeout:.0f} s; import errors: "
                       + ("\n".join(errors) if errors else "none"))

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> str:
        """Unpause ``dag_id`` and trigger a run with ``conf``; return the run id."""
        self.call("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        run = self.call("POST", f"/dags/{dag_id}/dagRuns", expect=(200, 201),
                        json={"logical_date": None, "conf": conf})
        return run["dag_run_id"]

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"]

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """Return every task instance of the run (mapped ones included)."""
        out: list[dict[str, Any]] = []
        while True:
            page = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances",
                             params={"limit": 100, "offset": len(out)})
            out += page["task_instances"]
            if len(out) >= page["total_entries"] or not page["task_instances"]:
                return out

    def tries(self, dag_id: str, run_id: str, task_id: str, map_index: int) -> list[dict]:
        """Return every try of one task instance, first try first."""
        path = (f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/{map_index}/tries"
                if map_index >= 0 else
                f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/tries")
        return sorted(self.call("GET", path)["task_instances"], key=lambda t: t["try_number"])

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float) -> str:
        """Return the run's final state (success/failed), or raise ApiError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.run_state(dag_id, run_id)
            if state in ("success", "failed"):
                return state
            time.sleep(2.0)
        raise ApiError(f"run {run_id} still {self.run_state(dag_id, run_id)} after "
                       f"{timeout:.0f} s")
