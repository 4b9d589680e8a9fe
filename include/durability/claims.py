"""Who may take a shard's next lease generation, and when: the waiting side of one writer per
shard (the story: ``include.durability``'s docstring).

* held and renewed: wait (whoever holds it, this run's own zombie try included);
* held, no renewal seen for the holder's TTL (by this machine's monotonic clock): the
  holder is dead; take the next generation (its journal is resumed);
* released incomplete (the holder failed): take the next generation at once;
* released complete (the holder generated every prompt; its upload is still to come): wait
  while the holder's run is live, so its upload publishes and this try finds the shard done;
  take over when that run ended, or when it is this run (this try is the retry of that one).

Airflow decides only that last case (``is_live``, asked by
``include.pipeline.airflow_state.airflow_run_is_live``), and fails closed: a run whose state
cannot be read counts as live (waiting costs time; a wrong "dead" costs a second writer).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from include.durability.fencing import resume_point
from include.durability.lease import (
    LEASE_TTL_S,
    Lease,
    LeaseState,
    count_beats,
    new_holder,
    newest,
    try_take,
)
from include.storage import Store

log = logging.getLogger(__name__)


class LeaseBusy(TimeoutError):
    """The shard stayed held by another holder for the whole wait."""


class _Watch:
    """The newest generation's renewals as this waiter saw them, on its own monotonic clock."""

    def __init__(self) -> None:
        self.generation = -1
        self.beats = 0
        self.since = 0.0

    def quiet_for(self, store: Store, prefix: str, state: LeaseState) -> float:
        """Return how long generation ``state`` has written no renewal, as seen from here."""
        now = time.monotonic()
        if state.generation != self.generation:
            self.generation, self.since = state.generation, now
            self.beats = count_beats(store, prefix, state.generation)
            return 0.0
        beats = count_beats(store, prefix, state.generation, self.beats)
        if beats != self.beats:
            self.beats, self.since = beats, now
        return now - self.since


def _may_take(state: LeaseState | None, watch: _Watch, store: Store, prefix: str,
              run_id: str | None, is_live: Callable[[str], bool] | None) -> str | None:
    """Return why the next generation may be taken now, or None to keep waiting."""
    if state is None:
        return "never leased"
    if state.released is not None:
        if not state.released.get("complete"):
            return f"generation {state.generation} was released unfinished"
        holder_run = state.run_id
        if holder_run is None or holder_run == run_id or is_live is None:
            return f"generation {state.generation} finished generating"
        if not is_live(holder_run):
            return f"run {holder_run} finished generating it but ended unpublished"
        return None
    quiet = watch.quiet_for(store, prefix, state)
    if quiet > state.ttl_s:
        return (f"generation {state.generation} ({state.body.get('holder')}) has not renewed "
                f"for {quiet:.0f}s (ttl {state.ttl_s:.0f}s)")
    return None


def wait_for_turn(store: Store, shard_id: str, journal_prefix: str, run_id: str | None,
                  is_live: Callable[[str], bool] | None, done: Callable[[], bool],
                  poll_s: float = 5.0, timeout_s: float | None = None,
                  ttl_s: float = LEASE_TTL_S) -> Lease | None:
    """Wait for the shard's lease and take it; return it started, or None once the shard is
    done (its output published meanwhile: nothing left to generate).

    ``is_live(run_id)`` says whether a run may still publish (see the module docstring);
    ``ttl_s`` is the TTL this holder declares. ``timeout_s`` (None: no limit; the task's
    execution_timeout bounds it) raises LeaseBusy: starting anyway would make two writers.
    """
    holder = new_holder(run_id)
    watch = _Watch()
    began = time.monotonic()
    announced: str | None = None
    while True:
        if done():
            log.info("%s: generated meanwhile by another run; nothing to do", shard_id)
            return None
        state = newest(store, journal_prefix)
        why = _may_take(state, watch, store, journal_prefix, run_id, is_live)
        if why is not None:
            generation = 1 if state is None else state.generation + 1
            # What this generation resumes from, counted just before it is taken: a segment
            # of the holder taken over that lands later is fenced out (``fencing``).
            segments, seen = resume_point(store, journal_prefix)
            if (0 if seen is None else seen.generation) != generation - 1:
                continue  # another waiter took a generation meanwhile: look at it afresh
            lease = try_take(store, journal_prefix, generation, holder, run_id, ttl_s,
                             segments=segments)
            if lease is None:
                continue  # another waiter won this generation: look at it afresh
            if done():  # published between the check and the take: hand the lease back
                lease.release(complete=True)
                log.info("%s: generated meanwhile by another run; nothing to do", shard_id)
                return None
            if announced is not None:
                log.info("%s: %s; starting", shard_id, why)
            return lease.start()
        assert state is not None
        who = f"{state.body.get('holder')} (generation {state.generation})"
        if who != announced:
            log.info("%s: being generated by %s; waiting for it to finish (this try resumes "
                     "its journal if it stops)", shard_id, who)
            announced = who
        if timeout_s is not None and time.monotonic() - began >= timeout_s:
            raise LeaseBusy(f"{shard_id}: still held by {who} after {timeout_s:.0f}s; not "
                            "starting a second writer")
        time.sleep(poll_s)
