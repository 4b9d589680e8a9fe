"""A shard's lease: taken create-only in the run's store, renewed by a heartbeat (why, and how
the generation fences a lost holder out: the package docstring, ``include.durability``).

Keys, under the shard's journal prefix ``journal/<shard>/`` (docs/data-layout.md, Leases; built
by ``include.layout``):

* ``lease/<generation:08d>.json``: generation N of the lease, taken by writing it
  create-only (S3 ``If-None-Match: *``, a local ``link``), only once N-1 is released or
  expired; its body records the segments it resumes from (``"segments"``, read by
  ``include.durability.fencing``).
* ``beats/<generation:08d>/<n:08d>``: the holder's renewals, one object per heartbeat
  (every ``ttl_s / 4``), numbered 1, 2, 3 ...
* ``lease/<generation:08d>.released``: the holder is done; ``"complete": true`` when it
  finished generating (every prompt has a record), so only its run's upload is still to come.

Expiry compares no timestamps across machines: a waiter judges the newest generation expired
when its beat count has not moved for ``ttl_s`` by the waiter's own monotonic clock. The holder
counts itself lost once it has not renewed for ``SELF_FENCE * ttl_s`` by its own monotonic
clock (before any waiter may take over), or as soon as it sees generation N+1: it then refuses
journal writes and never publishes.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from include.layout import beat_key, beats_prefix, lease_key, lease_prefix, released_key
from include.outcomes import GenerationError
from include.storage import ObjectExistsError, Store

log = logging.getLogger(__name__)

#: How long a holder that stopped renewing keeps the shard: minutes, not the task timeout.
LEASE_TTL_S = 120.0
#: A holder stops writing after this share of the TTL without a renewal, so it has stopped
#: before a waiter (judging by its own clock, from the last renewal it saw) may take over.
SELF_FENCE = 0.75
_LEASE_RE = re.compile(r"(\d{8})\.(json|released)$")


class LeaseLost(GenerationError):
    """This holder's lease was taken over or could not be renewed: stop, publish nothing."""


def new_holder(run_id: str | None) -> str:
    """Return a holder id unique to this try: two tries of one run are two holders."""
    return f"{run_id or 'local'}/{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class LeaseState:
    """The newest generation of a shard's lease as stored."""

    generation: int
    body: dict[str, Any]
    #: The release marker's body, None while the generation is held.
    released: dict[str, Any] | None

    @property
    def run_id(self) -> str | None:
        return self.body.get("run_id")

    @property
    def ttl_s(self) -> float:
        return float(self.body.get("ttl_s", LEASE_TTL_S))


def newest(store: Store, prefix: str) -> LeaseState | None:
    """Return the newest lease generation of the shard under ``prefix`` (None: never taken)."""
    taken: set[int] = set()
    released: set[int] = set()
    for key in store.list(lease_prefix(prefix)):
        match = _LEASE_RE.search(key)
        if match:
            (taken if match.group(2) == "json" else released).add(int(match.group(1)))
    if not taken:
        return None
    gen = max(taken)
    body = json.loads(store.read(lease_key(prefix, gen)))
    rel = json.loads(store.read(released_key(prefix, gen))) if gen in released else None
    return LeaseState(gen, body, rel)


def count_beats(store: Store, prefix: str, generation: int, known: int = 0) -> int:
    """Return how many renewals generation ``generation`` has written.

    From ``known`` (a count seen before) it probes the next keys (one HEAD a poll while the
    holder is quiet) instead of listing every renewal again.
    """
    if known == 0:
        keys = store.list(beats_prefix(prefix, generation))
        known = max((int(k.rsplit("/", 1)[1]) for k in keys if k.rsplit("/", 1)[1].isdigit()),
                    default=0)
    while store.exists(beat_key(prefix, generation, known + 1)):
        known += 1
    return known


def check_token(store: Store, prefix: str, generation: int, what: str) -> None:
    """Raise LeaseLost if a generation newer than ``generation`` was taken.

    Generations are taken one after another, so generation + 1 existing is the whole test.
    """
    newer = lease_key(prefix, generation + 1)
    if store.exists(newer):
        raise LeaseLost(f"{what}: lease generation {generation} was taken over ({store.uri(newer)}"
                        " exists); a newer holder owns the shard, so this one writes nothing "
                        "more")


class Lease:
    """Generation ``generation`` of a shard's lease, held by this process.

    ``start()`` runs the heartbeat thread; ``check()`` (cheap, no I/O) raises LeaseLost once
    the lease is lost; ``confirm()`` asks the store too; ``release()`` ends it.
    """

    def __init__(self, store: Store, prefix: str, generation: int, holder: str,
                 ttl_s: float, taken_monotonic: float) -> None:
        self.store, self.prefix, self.generation = store, prefix, generation
        self.holder, self.ttl_s = holder, ttl_s
        self.beats = 0
        # The last renewal that succeeded, by when it *started*: the conservative end.
        self._renewed = taken_monotonic
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._released = False

    @property
    def token(self) -> dict[str, Any]:
        """The fencing token a summary and a manifest carry."""
        return {"generation": self.generation, "holder": self.holder}

    @property
    def interval_s(self) -> float:
        return self.ttl_s / 4

    def start(self) -> Lease:
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"lease-{self.prefix}-{self.generation}")
        self._thread.start()
        return self

    def lost(self) -> str | None:
        """Return why the lease is lost, or None while it is held."""
        if self._lost is None and time.monotonic() - self._renewed > SELF_FENCE * self.ttl_s:
            self._lost = (f"not renewed for {time.monotonic() - self._renewed:.1f}s (ttl "
                          f"{self.ttl_s:.0f}s); a waiter may have taken the shard over")
        return self._lost

    def check(self) -> None:
        """Raise LeaseLost if the lease is lost (reads no store: safe on every journal write)."""
        why = self.lost()
        if why is not None:
            raise LeaseLost(f"{self.prefix}: lease generation {self.generation} is lost ({why})"
                            "; stopping before anything more is written or published")

    def confirm(self) -> None:
        """``check()``, then ask the store that no newer generation exists (before publishing
        or reporting success)."""
        self.check()
        try:
            check_token(self.store, self.prefix, self.generation, self.prefix)
        except LeaseLost as exc:
            self._lost = str(exc)
            raise

    def renew(self) -> None:
        """Write the next renewal, unless a newer generation exists (then the lease is lost)."""
        started = time.monotonic()
        try:
            if self.store.exists(lease_key(self.prefix, self.generation + 1)):
                self._lost = f"generation {self.generation + 1} was taken"
                log.error("%s: lease generation %d taken over by generation %d; this try "
                          "stops", self.prefix, self.generation, self.generation + 1)
                return
            # The body depends on holder and number only: a retried PUT writes equal bytes.
            body = json.dumps({"holder": self.holder, "n": self.beats + 1}).encode()
            self.store.write_new(beat_key(self.prefix, self.generation, self.beats + 1), body)
        except Exception as exc:  # noqa: BLE001 - a missed renewal is judged by lost()
            log.warning("%s: renewing lease generation %d failed (%s); lost after %.0fs "
                        "without a renewal", self.prefix, self.generation, exc,
                        SELF_FENCE * self.ttl_s)
            return
        self.beats += 1
        self._renewed = started

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.renew()
            if self.lost() is not None:
                return

    def stop(self) -> None:
        """Stop the heartbeat (the lease then expires after its TTL unless released)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def release(self, complete: bool) -> None:
        """Stop renewing and release the lease: ``complete`` when every prompt has a record.

        A lost lease is not released: it belongs to a newer generation now.
        """
        self.stop()
        if self._released or self.lost() is not None:
            return
        self._released = True
        body = {"holder": self.holder, "complete": complete}
        try:
            self.store.write_new(released_key(self.prefix, self.generation),
                                 json.dumps(body).encode())
        except Exception as exc:  # noqa: BLE001 - unreleased, it simply expires after the TTL
            log.warning("%s: releasing lease generation %d failed (%s); it expires in %.0fs",
                        self.prefix, self.generation, exc, self.ttl_s)


def try_take(store: Store, prefix: str, generation: int, holder: str, run_id: str | None,
             ttl_s: float = LEASE_TTL_S, *, segments: dict[str, int] | None = None
             ) -> Lease | None:
    """Try to take lease generation ``generation``; return it, or None if another took it.

    The caller has judged ``generation - 1`` released or expired. Not started: call
    ``start()``. Both answers of ``write_new`` mean this taker's bytes are stored (the body
    names this holder); ObjectExistsError means another taker won. ``segments`` is what the
    generation resumes from (``fencing.resume_point``, listed just before): per writer of an
    earlier generation, how many of its segments count; None counts none of them.
    """
    started = time.monotonic()
    # taken_at is for people reading the store; no decision ever compares it with a clock.
    body = {"generation": generation, "holder": holder, "run_id": run_id, "ttl_s": ttl_s,
            "taken_at": time.time(), "segments": dict(segments or {})}
    try:
        store.write_new(lease_key(prefix, generation), json.dumps(body, sort_keys=True).encode())
    except ObjectExistsError:
        return None
    log.info("%s: took lease generation %d as %s (ttl %.0fs)", prefix, generation, holder,
             ttl_s)
    return Lease(store, prefix, generation, holder, ttl_s, started)
