"""How the native tier's API server reaches each worker's log server (``./dev up``).

While a task runs, the API server reads its log from the worker that runs it, at
``http://<the worker's host name>:<[logging] worker_log_server_port>/log/...``. In compose each
worker is a container whose host name the network resolves and which serves its logs on the
same port 8793. The native tier's workers share one machine: each reports its own name
(``scripts.deploy_hostname``), which no resolver knows, and serves its logs on a port of its
own, which one ``worker_log_server_port`` cannot name. So the API server's task log handler
reads ``DEPLOY_WORKER_LOG_SERVERS`` (``{"worker-1": port, ...}``) and asks a named worker's log
server on 127.0.0.1 at that worker's port; a name it does not list goes to Airflow's own URL.
Set as ``[logging] logging_config_class`` on the native API server only (``NATIVE_ONLY``).
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any
from urllib.parse import urljoin

from airflow.config_templates.airflow_local_settings import DEFAULT_LOGGING_CONFIG
from airflow.utils.log.file_task_handler import FileTaskHandler, LogType

#: The environment variable naming each worker's log server port.
LOG_SERVERS_ENV = "DEPLOY_WORKER_LOG_SERVERS"


def worker_log_servers() -> dict[str, int]:
    """Return each native worker's name and log server port (none outside the native tier)."""
    return {str(k): int(v) for k, v in json.loads(os.environ.get(LOG_SERVERS_ENV) or "{}")
            .items()}


class NativeTierTaskHandler(FileTaskHandler):
    """Airflow's task log handler, reading a running task's log from its worker's own port."""

    def _get_log_retrieval_url(self, ti: Any, log_relative_path: str,
                               log_type: Any = None) -> tuple[str | None, str | None]:
        url, rel_path = super()._get_log_retrieval_url(ti, log_relative_path, log_type)
        port = worker_log_servers().get(getattr(ti, "hostname", None) or "")
        if url and rel_path and log_type != LogType.TRIGGER and port:
            url = urljoin(f"http://127.0.0.1:{port}/log/", rel_path)
        return url, rel_path


LOGGING_CONFIG = copy.deepcopy(DEFAULT_LOGGING_CONFIG)
LOGGING_CONFIG["handlers"]["task"]["class"] = f"{__name__}.NativeTierTaskHandler"
