"""The demo's progress on the terminal: the run's own lines as they come, the whole log in a file.

``airflow dags test`` writes hundreds of lines (Airflow's own bookkeeping, each task's log);
the demo shows the ones that say how the run goes: each task's start and end (with its state
and time), the generate tasks' progress lines, the shard plan, the report's verdict, every
warning and error of the pipeline's own code and a failed task's exception. When none came
for ``QUIET_S`` seconds (a model loading, the report drawing its plots), a line says which
task is still running, so the terminal is never silent for long.
"""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

#: Loggers whose lines are the run's progress: the generate tasks' progress lines, the shard
#: plan (how many shards, how many left) and the report's verdict with its quality gates.
SHOWN_LOGGERS = ("include.engine.tally", "include.prompts.plan", "include.reporting.build")
#: A line at least this often (the issue's "at least every ~10 s", with a poll's slack).
QUIET_S = 8.0
_RECORD = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z \[(?P<level>\w+)\s*\] (?P<message>.*)$")
#: The end of a record: ``[logger]`` and structlog's ``key=value`` pairs.
_LOGGER = re.compile(r"\s*\[(?P<logger>[\w.]+)\](?: \w+=.*)?$")
_TASK = re.compile(r"\[DAG TEST\] (?P<event>starting|end task) task_id=(?P<task>\S+) "
                   r"map_index=(?P<index>-?\d+)")
_STATE = re.compile(r"^Task instance state updated\b.*\bnew_state=(?P<state>\w+)")


class Progress:
    """Turns the log's lines into the lines shown (``feed``) and fills silences (``tick``)."""

    def __init__(self, label: str, log_path: Path, clock: Callable[[], float] = time.monotonic,
                 started: float | None = None) -> None:
        self.clock = clock
        self.started = clock() if started is None else started
        self.log_path = log_path
        self.label = label
        self.task_started = self.last_shown = self.clock()
        self.state = ""
        self.record: list[str] = []
        self.failure: list[str] | None = None  # the plain lines after "Task failed"

    def _stamp(self, text: str) -> str:
        elapsed = int(self.clock() - self.started)
        return f"[{elapsed // 60:2d}:{elapsed % 60:02d}] {text}"

    def feed(self, line: str) -> list[str]:
        """Take one line of the log; return the lines to show now."""
        line = line.rstrip("\n")
        shown: list[str] = []
        if _RECORD.match(line):
            shown += self._close()
            self.record = [line]
        elif self.record:
            self.record.append(line)
        elif self.failure is not None and line.strip():
            self.failure.append(line)
        if self.record and _LOGGER.search(self.record[-1]):
            shown += self._close()
        if shown:
            self.last_shown = self.clock()
        return [self._stamp(s) for s in shown]

    def finish(self) -> list[str]:
        """Return what is left to show once the log has ended."""
        return [self._stamp(s) for s in self._close()]

    def tick(self) -> list[str]:
        """Return a line saying what still runs when nothing was shown for ``QUIET_S``."""
        now = self.clock()
        if now - self.last_shown < QUIET_S:
            return []
        self.last_shown = now
        return [self._stamp(f"  {self.label}: still running ({now - self.task_started:.0f} s; "
                            f"log: {self.log_path})")]

    def _close(self) -> list[str]:
        shown = self._failure_lines()
        if not self.record:
            return shown
        head = _RECORD.match(self.record[0])
        lines = [head["message"], *self.record[1:]]
        lines[-1] = _LOGGER.sub("", lines[-1])
        logger_match = _LOGGER.search(self.record[-1])
        logger = logger_match["logger"] if logger_match else ""
        raw, self.record = head["message"], []
        return shown + self._shown(head["level"], logger, lines, raw)

    def _shown(self, level: str, logger: str, lines: list[str], raw: str) -> list[str]:
        task = _TASK.search(lines[0])
        state = _STATE.match(raw)
        if task:
            return self._task_event(task)
        if state:
            self.state = state["state"]
        elif lines[0].startswith("Task failed with exception"):
            self.failure = []
        elif lines[0].startswith("[DAG TEST] running trigger in line"):
            return [f"  {self.label}: deferred, its trigger waits (in line)"]
        elif logger.startswith(SHOWN_LOGGERS):
            return [f"  {line}" for line in lines if line.strip()]
        elif level in ("warning", "error", "critical") and "include." in logger:
            return [f"  {level}: {lines[0]}"]
        return []

    def _task_event(self, task: re.Match[str]) -> list[str]:
        index = int(task["index"])
        label = task["task"] if index < 0 else f"{task['task']}[{index}]"
        if task["event"] == "starting":
            self.label, self.task_started, self.state = label, self.clock(), ""
            return [f"{label} started"]
        took = self.clock() - self.task_started
        # Between two tasks, dags test's own loop runs (the next task's turn, a retry's wait).
        self.label, self.task_started = "airflow dags test (between tasks)", self.clock()
        return [f"{label} {self.state or 'ended'} in {took:.1f} s"]

    def _failure_lines(self) -> list[str]:
        failure, self.failure = self.failure, None
        if not failure:
            return []
        # The traceback's last unindented line is the exception and its message.
        cause = next((ln for ln in reversed(failure) if not ln.startswith((" ", "\t"))),
                     failure[-1])
        return [f"  error: {cause.strip()}"]


def run_shown(cmd: list[str], env: dict[str, str], log_path: Path, label: str,
              started: float, out: IO[str] | None = None) -> int:
    """Run ``cmd`` with its output in ``log_path``, showing its progress (on ``out``, standard
    output by default); return its exit code."""
    out = out or sys.stdout
    progress = Progress(label, log_path, started=started)
    lines: queue.Queue[str | None] = queue.Queue()
    env = {**env, "PYTHONUNBUFFERED": "1"}  # lines as they are written, not per 8 KiB
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                lines.put(line)
            lines.put(None)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        while True:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                shown = progress.tick()
            else:
                if line is None:
                    break
                shown = progress.feed(line)
            for text in shown:
                print(text, file=out, flush=True)
        for text in progress.finish():
            print(text, file=out, flush=True)
        reader.join()
    return proc.wait()
