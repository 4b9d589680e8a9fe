"""The prepare worker started from a Celery pool's descendant, as the prepare task runs.

The rehearsal at the planned size (issue 28) found every prepare of 64 MB or more failing in
the Celery tier: the task's process is a fork of a billiard pool process, which multiprocessing
takes for a daemon ("daemonic processes are not allowed to have children") with billiard's
authentication key ("Pickling an AuthenticationString object is disallowed"), and whose main
module is the ``airflow`` script, which a spawned child runs again first and which fails
there ("Could not parse SQLAlchemy URL"). Smaller inputs never start the worker, so no test
and no smaller rehearsal saw it."""

from __future__ import annotations

import multiprocessing
import os
import sys

import pytest

from include.prompts.workers import map_in_order


def _pid(i: int) -> tuple[int, int]:
    return i, os.getpid()


def _prepare_here(answers, main_script: str | None = None) -> None:
    if main_script:  # as the ``airflow`` console script is the worker's main module
        main = sys.modules["__main__"]
        main.__file__, main.__spec__ = main_script, None
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


@pytest.mark.parametrize(("start", "script"), [
    (_billiard_process, True), (_billiard_process, False), (_stdlib_daemon, False)],
    ids=["celery pool process, airflow script as main", "celery pool process (billiard)",
         "daemonic process"])
def test_a_pool_process_still_prepares_on_two_cores(start, script, tmp_path) -> None:
    main_script = tmp_path / "airflow"
    main_script.write_text("raise SystemExit('the main script ran again in the worker')\n")
    answers = multiprocessing.get_context("fork").Queue()
    process = start(_prepare_here, (answers, str(main_script) if script else None))
    process.start()
    outcome, results, pid, restored = answers.get(timeout=120)
    process.join(timeout=60)
    assert outcome == "ok", results
    assert [i for i, _ in results] == [0, 1, 2, 3]
    pids = {p for _, p in results}
    assert pid in pids and len(pids) == 2  # the caller and its worker both ran jobs
    assert restored  # daemon flag and key are the process's own again once the jobs are done
