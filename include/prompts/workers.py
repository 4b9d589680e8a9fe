"""Run a sequence of independent jobs on two cores and take their results in order.

The prepare stage reads and normalises each source independently and only then dedupes them
in settings order; the first part is most of the work. ``map_in_order`` lets one worker
process claim jobs from the same list as the caller, so both cores work while the caller still
consumes the results strictly in job order (an error surfaces where the job that raised it
stands in that order, as it would in a plain loop).

The worker is a ``ProcessPoolExecutor`` process started with ``spawn``: a fork of a process
that runs threads (a Celery worker, the Airflow task runner) can inherit a lock held by a
thread that does not exist in the child, and hang on it. Under a Celery worker spawning also
needs ``_as_from_a_main_process`` (why: its docstring): without it every prepare of 64 MB or
more failed there, found by the rehearsal at the planned size.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from logging.handlers import QueueHandler, QueueListener
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class WorkerError(RuntimeError):
    """The worker process died before sending a job's result back."""


def usable_cpus() -> int:
    """Return the CPUs this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def map_in_order(
    jobs: int,
    work: Callable[[int], T],
    *,
    parallel: bool,
    claim_order: Sequence[int] | None = None,
) -> Iterator[T]:
    """Yield ``work(0)``, ..., ``work(jobs - 1)`` in order; raise what a job raised, in turn.

    With ``parallel``, shared with one worker process (the module docstring), claimed in
    ``claim_order`` (default: job order; the longest first balances best). ``work`` and its
    results must be picklable, and ``work`` must not depend on state the caller set up (the
    worker is a fresh interpreter); its log records go to the caller's loggers.
    """
    if not parallel or jobs < 2:
        for i in range(jobs):
            yield work(i)
        return
    order = list(range(jobs)) if claim_order is None else list(claim_order)
    if sorted(order) != list(range(jobs)):
        raise ValueError(f"claim_order must order the jobs 0..{jobs - 1}, got {order}")
    yield from _Jobs(order, work).results()


class _Jobs:
    """The jobs of one ``map_in_order`` call, shared out between the caller and the worker."""

    def __init__(self, order: list[int], work: Callable[[int], Any]) -> None:
        self.jobs = len(order)
        self.work = work
        self.claims = iter(order)
        self.lock = threading.Lock()  # the caller and the pool's thread both claim jobs
        self.remote: dict[int, Future[Any]] = {}  # jobs the worker claimed
        self.stopped = False

    def claim(self) -> int | None:
        with self.lock:
            return next(self.claims, None)

    def results(self) -> Iterator[Any]:
        ctx = multiprocessing.get_context("spawn")
        records = ctx.Queue()
        listener = QueueListener(records, _ToLoggers())
        before = set(multiprocessing.active_children())
        self.pool = ProcessPoolExecutor(
            max_workers=1,
            mp_context=ctx,
            initializer=_start_worker,
            initargs=(records, logging.getLogger().getEffectiveLevel()),
        )
        listener.start()
        finished = False
        try:
            # The caller claims first: which process runs which job (and holds its memory)
            # does not depend on how fast the worker starts.
            i = self.claim()
            with _as_from_a_main_process():  # the pool starts its process on this first job
                self.feed_worker()
            yield from self._in_order(i)
            finished = True
        finally:
            with self.lock:
                self.stopped = True
            self.pool.shutdown(wait=finished, cancel_futures=True)
            if not finished:
                # A job failed or the caller stopped early: the worker's job is not waited
                # for. The pool's process is the child started since ``before``.
                for process in set(multiprocessing.active_children()) - before:
                    process.terminate()
                    process.join()
            listener.stop()
            records.close()

    def feed_worker(self, done: Future[Any] | None = None) -> None:
        """Give the worker its next job: first from the caller, then when it finishes one."""
        if done is not None and (done.cancelled() or done.exception() is not None):
            return  # the caller raises it and stops; later jobs would be wasted
        with self.lock:
            if self.stopped:
                return
            i = next(self.claims, None)
            if i is None:
                return
            try:
                future = self.pool.submit(self.work, i)
            except Exception as exc:  # a broken pool: the caller raises it in turn
                future = Future()
                future.set_exception(exc)
            self.remote[i] = future
        future.add_done_callback(self.feed_worker)

    def _in_order(self, i: int | None) -> Iterator[Any]:
        jobs = self.jobs
        local: dict[int, tuple[Any, BaseException | None]] = {}  # jobs the caller ran
        nxt = 0
        while nxt < jobs:
            if i is not None:
                try:
                    local[i] = (self.work(i), None)
                except Exception as exc:  # re-raised in turn, as in a plain loop
                    local[i] = (None, exc)
            while nxt < jobs:
                if nxt in local:
                    result, error = local.pop(nxt)
                else:
                    # Every job is claimed by the caller (in ``local``) or by the worker (in
                    # ``remote``, under the lock): not in either means not claimed yet.
                    with self.lock:
                        pending = self.remote.get(nxt)
                    assert pending is not None or i is not None, f"job {nxt} was never claimed"
                    if pending is None or (i is not None and not pending.done()):
                        break  # the caller runs a job of its own before it waits
                    with self.lock:
                        del self.remote[nxt]  # its result is freed once yielded
                    result, error = _outcome(pending)
                if error is not None:
                    raise error
                yield result
                nxt += 1
            i = self.claim()


@contextlib.contextmanager
def _as_from_a_main_process() -> Iterator[None]:
    """Start the worker as a plain main process would, then put back what this one was.

    Under Celery the task's process is a fork of a billiard pool process, which billiard
    installed as multiprocessing's current process (``billiard/process.py``,
    ``_set_current_process``): daemonic, so multiprocessing refuses it children, with
    billiard's authentication key, which refuses to be pickled into a spawned child
    ("Pickling an AuthenticationString object is disallowed"); and its main module is the
    ``airflow`` script, which a spawned child would run again first (``spawn.py``,
    ``_fixup_main_from_path``) and which fails there without the scheduler's database. The
    first two live in the process's ``_config``, where multiprocessing reads them; the child
    is told of no main module to run. Safe here: the worker never outlives ``results``, and
    its jobs are functions of this package.
    """
    config = multiprocessing.current_process()._config  # noqa: SLF001 - see above
    saved = {k: config[k] for k in ("daemon", "authkey") if k in config}
    config["daemon"] = False
    if "authkey" in config:
        config["authkey"] = multiprocessing.process.AuthenticationString(bytes(config["authkey"]))
    main = sys.modules.get("__main__")
    main_file = main.__dict__.pop("__file__", None) if main is not None else None
    main_spec = getattr(main, "__spec__", None)
    if main is not None:
        main.__spec__ = None
    try:
        yield
    finally:
        config.pop("daemon", None)
        config.update(saved)
        if main is not None:
            main.__spec__ = main_spec
            if main_file is not None:
                main.__file__ = main_file


def _outcome(future: Future[Any]) -> tuple[Any, BaseException | None]:
    try:
        return future.result(), None
    except BrokenProcessPool as exc:  # its cause says more where the pool knows it
        raise WorkerError(
            f"the prepare worker process exited before finishing its jobs ({exc}); if it was "
            "killed for memory, lower the input size or run on one core"
        ) from exc
    except Exception as exc:
        return None, exc


class _ToLoggers(logging.Handler):
    """Hands each record from the worker to the caller's logger of the same name."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger(record.name).handle(record)


def _start_worker(records: Any, level: int) -> None:
    root = logging.getLogger()
    root.handlers[:] = [QueueHandler(records)]
    root.setLevel(level)
