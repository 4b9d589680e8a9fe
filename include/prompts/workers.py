"""Run a sequence of independent jobs on two cores and take their results in order.

The prepare stage reads and normalises each source independently and only then dedupes them
in settings order; the first part is most of the work. ``map_in_order`` lets one forked worker
process claim jobs from the same queue as the caller, so both cores work while the caller still
consumes the results strictly in job order (an error surfaces where the job that raised it
stands in that order, as it would in a plain loop).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import tempfile
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class WorkerError(RuntimeError):
    """The worker process died, or raised something that could not be sent back."""


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

    With ``parallel``, a worker forked now claims jobs from a shared counter, as the caller
    does between the results it yields: each job runs once, in whichever process is free.
    Jobs are claimed in ``claim_order`` (default: job order); the longest first balances
    the two processes best.
    ``work`` runs in the worker on the state forked with it, so it must return a picklable
    result and must not depend on what the caller does after the fork. Results are pickled
    back through a file each (the pipe carries only their names, so the worker never waits for
    the caller to read). Without ``parallel``, or where ``fork`` is unavailable, it is a
    plain loop.
    """
    if not parallel or jobs < 2 or "fork" not in multiprocessing.get_all_start_methods():
        for i in range(jobs):
            yield work(i)
        return
    order = list(range(jobs)) if claim_order is None else list(claim_order)
    if sorted(order) != list(range(jobs)):
        raise ValueError(f"claim_order must order the jobs 0..{jobs - 1}, got {order}")
    ctx = multiprocessing.get_context("fork")
    counter = ctx.Value("i", 1)  # the caller takes the first job before the fork: which
    # process runs which job (and holds its memory) does not depend on who is quicker
    receive, send = ctx.Pipe(duplex=False)
    results = tempfile.TemporaryDirectory(prefix="prepare-results-")
    worker = ctx.Process(
        target=_worker,
        args=(order, work, counter, send, results.name),
        name="prepare-worker",
        daemon=True,
    )
    worker.start()
    send.close()  # only the worker's end stays open: a dead worker reads as EOF here
    done: dict[int, tuple[Any, BaseException | None]] = {}
    try:
        nxt = 0
        i: int | None = order[0]
        while nxt < jobs:
            if i is not None:
                try:
                    done[i] = (work(i), None)
                except Exception as exc:  # re-raised in turn, as in a plain loop
                    done[i] = (None, exc)
            while nxt not in done and (i is None or receive.poll()):
                # Nothing left to claim: wait for the worker; else take what it has finished.
                _receive(receive, done, worker)
            while nxt in done:
                result, error = done.pop(nxt)
                if error is not None:
                    raise error
                yield result
                nxt += 1
            i = _claim(counter, order)
        worker.join()
    finally:
        if worker.is_alive():  # the caller stopped early or a job failed: stop the worker
            worker.terminate()
            worker.join()
        receive.close()
        results.cleanup()


def _claim(counter: Any, order: list[int]) -> int | None:
    with counter.get_lock():
        n = counter.value
        if n >= len(order):
            return None
        counter.value = n + 1
        return order[n]


def _receive(receive: Any, done: dict[int, tuple[Any, BaseException | None]], worker: Any) -> None:
    try:
        i, path = receive.recv()
    except EOFError:
        worker.join()
        raise WorkerError(
            f"the prepare worker process exited (code {worker.exitcode}) before finishing its "
            "jobs; if it was killed for memory, lower the input size or run on one core"
        ) from None
    with open(path, "rb") as fh:
        done[i] = pickle.load(fh)
    os.unlink(path)


def _worker(
    order: list[int], work: Callable[[int], Any], counter: Any, send: Any, directory: str
) -> None:
    try:
        while (i := _claim(counter, order)) is not None:
            try:
                outcome: tuple[Any, BaseException | None] = (work(i), None)
            except Exception as exc:
                outcome = (None, exc)
            path = os.path.join(directory, f"{i}.pickle")
            with open(path, "wb") as fh:
                try:
                    pickle.dump(outcome, fh, protocol=pickle.HIGHEST_PROTOCOL)
                except Exception as exc:  # an unpicklable result or exception
                    detail = "".join(traceback.format_exception_only(exc)).strip()
                    error = WorkerError(f"job {i}: cannot send its result back ({detail})")
                    fh.seek(0)
                    fh.truncate()
                    pickle.dump((None, error), fh)
                    outcome = (None, error)
            send.send((i, path))
            if outcome[1] is not None:
                return  # the caller raises it and stops; later jobs would be wasted
    finally:
        send.close()
