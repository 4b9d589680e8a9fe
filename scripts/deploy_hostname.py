"""The host name a native Celery worker reports (``[core] hostname_callable``).

In compose each worker is a container with a host name of its own, which Airflow records on
every task instance it runs. The native tier's workers share one machine, so each reports the
name the launcher gives it (``DEPLOY_WORKER_NAME``), and a task instance still says which
worker ran it.
"""

from __future__ import annotations

import os
import socket


def worker_hostname() -> str:
    """Return this worker's name, or the machine's name outside the native tier."""
    return os.environ.get("DEPLOY_WORKER_NAME") or socket.getfqdn()
