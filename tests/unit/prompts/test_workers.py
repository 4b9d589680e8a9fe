"""The prepare worker started from a daemonic process, as a task runs under Celery.

The rehearsal at the planned size (issue 28) found every prepare of 64 MB or more failing in
the Celery tier with "daemonic processes are not allowed to have children": the task's
process descends from the worker's daemonic pool process, and smaller inputs never start the
worker, so no test and no smaller rehearsal saw it."""

from __future__ import annotations

import multiprocessing
import os

from include.prompts.workers import map_in_order


def _pid(i: int) -> tuple[int, int]:
    return i, os.getpid()


def _prepare_in_a_daemon(answers) -> None:
    me = multiprocessing.current_process()
    try:
        results = list(map_in_order(4, _pid, parallel=True))
        answers.put(("ok", results, os.getpid(), me.daemon))
    except BaseException as exc:  # noqa: BLE001 - sent back to the test, which names it
        answers.put(("failed", f"{type(exc).__name__}: {exc}", os.getpid(), me.daemon))


def test_a_daemonic_process_still_prepares_on_two_cores() -> None:
    ctx = multiprocessing.get_context("fork")
    answers = ctx.Queue()
    daemon = ctx.Process(target=_prepare_in_a_daemon, args=(answers,), daemon=True)
    daemon.start()
    outcome, results, pid, still_daemonic = answers.get(timeout=120)
    daemon.join(timeout=60)
    assert outcome == "ok", results
    assert [i for i, _ in results] == [0, 1, 2, 3]
    pids = {p for _, p in results}
    assert pid in pids and len(pids) == 2  # the caller and its worker both ran jobs
    assert still_daemonic  # the flag is the process's again once the jobs are done
