"""The demo shows the run's progress, never silent for long, the whole log kept in a file.

The lines below are ``airflow dags test``'s own (taken from a demo run's log, shortened).
"""

from __future__ import annotations

import sys
from pathlib import Path

from scripts import demo_progress
from scripts.demo_progress import QUIET_S, Progress, run_shown

T = "2026-12-02T05:32:05.404607Z"
LOG = [
    f"{T} [info     ] [DAG TEST] starting task_id=shard.generate map_index=2 "
    "[airflow.sdk.definitions.dag] loc=dag.py:1501",
    f"{T} [info     ] Task started                   "
    "[airflow.api_fastapi.execution_api.routes.task_instances] correlation_id=01a hostname=vm",
    f"{T} [info     ] output location s3://demo/runs (protected prefixes: completions/) "
    "[include.storage.store] loc=store.py:149",
    f"{T} [info     ] shard-00002: 20/50 finished (ok 20, skipped 0, failed 0, truncated 0) | "
    "14.31 req/s | ETA 3s [include.engine.tally] loc=tally.py:113",
    f"{T} [info     ] Task instance state updated    "
    "[airflow.api_fastapi.execution_api.routes.task_instances] correlation_id=01a "
    "loc=task_instances.py:485 new_state=success rows_affected=1 ti_id=01a",
    f"{T} [info     ] [DAG TEST] end task task_id=shard.generate map_index=2 "
    "[airflow.sdk.definitions.dag] loc=dag.py:1563",
    f"{T} [info     ] [DAG TEST] starting task_id=check_settings map_index=-1 "
    "[airflow.sdk.definitions.dag] loc=dag.py:1501",
    f"{T} [error    ] Task failed with exception     [task] loc=task_runner.py:1676",
    "Traceback (most recent call last):",
    '  File "/work/main/include/pipeline/upload.py", line 17, in run',
    "    from include.storage.base import copy_hashed",
    "ImportError: cannot import name 'copy_hashed' from 'include.storage.base'",
    f"{T} [info     ] run demo report: FAILED | 8 shards produced, 0 reused",
    "  fail max_failure_rate: measured 0.5, at most 0.01 allowed [include.reporting.build] "
    "loc=report.py:344",
]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _fed(lines: list[str]) -> tuple[Progress, Clock, list[str]]:
    clock = Clock()
    progress = Progress("airflow dags test", Path("var/demo/dag-test.log"), clock=clock)
    shown: list[str] = []
    for line in lines:
        clock.now += 0.5
        shown += progress.feed(line + "\n")
    return progress, clock, shown + progress.finish()


def test_task_starts_ends_progress_lines_and_a_failure_s_exception_are_shown() -> None:
    _, _, shown = _fed(LOG)
    text = [line.split("] ", 1)[1] for line in shown]
    assert text == [
        "shard.generate[2] started",
        "  shard-00002: 20/50 finished (ok 20, skipped 0, failed 0, truncated 0) | 14.31 req/s "
        "| ETA 3s",
        "shard.generate[2] success in 2.5 s",
        "check_settings started",
        "  error: ImportError: cannot import name 'copy_hashed' from 'include.storage.base'",
        "  run demo report: FAILED | 8 shards produced, 0 reused",
        "    fail max_failure_rate: measured 0.5, at most 0.01 allowed",
    ]
    assert shown[0].startswith("[ 0:00] ") and shown[-1].startswith("[ 0:07] ")


def test_a_silence_is_filled_with_what_still_runs() -> None:
    progress, clock, _ = _fed(LOG[:1])
    clock.now += QUIET_S - 1
    assert progress.tick() == []
    clock.now += 1
    (line,) = progress.tick()
    assert line.endswith(f"shard.generate[2]: still running ({QUIET_S:.0f} s; "
                         "log: var/demo/dag-test.log)")
    assert progress.tick() == []  # once per silence, not once per poll


def test_run_shown_keeps_every_line_in_the_log_and_shows_the_run_s_own(tmp_path, capsys):
    script = "import sys\nfor line in sys.argv[1:]: print(line)\nsys.exit(3)\n"
    log = tmp_path / "run.log"
    code = run_shown([sys.executable, "-c", script, *LOG[:6]], {}, log, "x",
                     started=demo_progress.time.monotonic())
    assert code == 3
    assert log.read_text().splitlines() == LOG[:6]
    out = capsys.readouterr().out.splitlines()
    assert [line.split("] ", 1)[1] for line in out][0] == "shard.generate[2] started"
    assert len(out) == 3
