"""The prepare worker started from a Celery pool's descendant, as the prepare task runs.

The rehearsal at the planned size (issue 28) found every prepare of 64 MB or more failing in
the Celery tier: the task's process is a fork of a billiard pool process, which multiprocessing
takes for a daemon ("daemonic processes are not allowed to have children") with billiard's
authentication key ("Pickling an AuthenticationString object is disallowed"). Smaller
inputs never start the worker, so no test and no smaller rehearsal saw it."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from include.prompts.workers import map_in_order


def _pid(i: int) -> tuple[int, int]:
    return i, os.getpid()


def _prepare_here(answers) -> None:
    me = multiprocessing.current_process()
    before = (me.daemon, type(me.authkey))
    try:
        results = list(map_in_order(4, _pid, parallel=True))
        answers.put(("ok", results, os.getpid(), before == (me.daemon, type(me.authkey))))
    except BaseException as exc:  # noqa: BLE001 - sent back to the test, which names it
        answers.put(("failed", f"{type(exc).__name__}: {exc}", os.getpid(), None))


def _billiard_process(target, args):
    import billiard

    return billiard.get_context("fork").Process(target=target, args=args, daemon=True)


def _stdlib_daemon(target, args):
    return multiprocessing.get_context("fork").Process(target=target, args=args, daemon=True)


@pytest.mark.parametrize("start", [_billiard_process, _stdlib_daemon],
                         ids=["celery pool process (billiard)", "daemonic process"])
def test_a_pool_process_still_prepares_on_two_cores(start) -> None:
    answers = multiprocessing.get_context("fork").Queue()
    process = start(_prepare_here, (answers,))
    process.start()
    outcome, results, pid, restored = answers.get(timeout=120)
    process.join(timeout=60)
    assert outcome == "ok", results
    assert [i for i, _ in results] == [0, 1, 2, 3]
    pids = {p for _, p in results}
    assert pid in pids and len(pids) == 2  # the caller and its worker both ran jobs
    assert restored  # daemon flag and key are the process's own again once the jobs are done
