"""A task that fails on purpose: its reason in the log, no traceback, no retry.

Airflow's task runner logs every exception a task raises with its traceback (13-15 frames of
Airflow's own code under a one-line reason, the largest thing in the log), except
``SystemExit``: that one is logged as one line, ``Task exited`` with its code, and then goes
through the task's retry policy. So a refusal is a ``SystemExit`` carrying the reason
(``include.settings.errors.TaskRefused``), and the DAG's retry policy (every task's, through
its default arguments) fails it at once. Any other exception keeps Airflow's retries and its
traceback: that one is a bug or an outage, where the frames help.
"""

from __future__ import annotations

import logging
from typing import NoReturn

from include.settings.errors import TaskRefused

log = logging.getLogger(__name__)


def refuse(reason: str, lines: list[str] | None = None) -> NoReturn:
    """Log ``lines`` (default: the reason's own lines) as errors, then fail the task with
    ``reason``'s first line: a person reads the reason, not Airflow's frames."""
    for line in lines if lines is not None else reason.splitlines():
        log.error("%s", line)
    raise TaskRefused(reason.splitlines()[0] if reason else "refused") from None
