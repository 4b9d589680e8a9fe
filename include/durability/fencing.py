"""Which journal segments count: the readers' side of a shard lease's fencing.

A holder stops writing once it knows its lease is lost, but a paused holder cannot know: a
PUT it started before the pause (a cut network, SIGSTOP, a long stall) lands whenever it
lands, possibly after a newer generation took the shard over, and its key's wall-clock part
says nothing about when that was. So no reader trusts landing order or a writer's clock;
each lease generation records, as it is taken, which segments it resumes from, and every
reader (resume, publish, compaction, the report) counts only those:

* a segment's key names its writer and place: ``part-<ns>-<generation:08d><hex12>-<seq:06d>
  .jsonl``; a writer puts its segments one at a time in ``seq`` order, so the segments of a
  writer that are in the store at any moment are its first n;
* the taker of generation N+1 lists the journal and writes, in the lease body, how many of
  each earlier writer's segments count (``"segments": {writer: n}``: those N's view counted,
  as many as were in the store then);
* a reader lists the segments, then reads the newest lease generation N: it keeps N's own
  segments and, of earlier generations, each writer's first ``segments[writer]``. Any other
  segment landed after a takeover: its records never reach a resume or the output, however
  its writer's clock ran (it is logged).

Segments without a generation (runs without a lease: the CLI) are never fenced, and neither
is anything under a lease taken by a release before this rule (no ``segments``). Segments
kept merge in (generation, key) order: generations, not clocks, order the holders.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from include.durability.lease import LeaseState, newest
from include.layout import SEGMENT_NAME, compacted_keys
from include.storage import Store

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Segment:
    """What a segment's key says: its writer's lease generation (0: none), writer id, seq."""

    generation: int
    writer: str
    seq: int


def parse_segment(key: str) -> Segment | None:
    """Return what a segment key says, or None for a key not written by a journal writer."""
    match = SEGMENT_NAME.search(key.rsplit("/", 1)[-1])
    if match is None:
        return None
    tag, hex_id, seq = match.groups()
    return Segment(int(tag) if tag else 0, (tag or "") + hex_id, int(seq))


def vouched(keys: Iterable[str], state: LeaseState | None) -> tuple[list[str], list[str]]:
    """Return ``(kept, fenced)``: the segments the newest lease ``state`` counts, in merge
    order, and those that landed after a takeover (see the module docstring)."""
    counts = None if state is None else state.body.get("segments")
    kept: list[tuple[int, str]] = []
    fenced: list[str] = []
    for key in keys:
        seg = parse_segment(key)
        generation = seg.generation if seg else 0
        if (seg is None or counts is None or generation == 0 or generation >= state.generation
                or seg.seq < int(counts.get(seg.writer, 0))):
            kept.append((generation, key))
        else:
            fenced.append(key)
    return [key for _, key in sorted(kept)], fenced


def resumed_counts(keys: Iterable[str]) -> dict[str, int]:
    """Return, per writer with a generation, how many of its segments (from seq 0, without a
    gap) are among ``keys``: what the next generation records it resumes from."""
    seqs: dict[str, set[int]] = {}
    for key in keys:
        seg = parse_segment(key)
        if seg is not None and seg.generation:
            seqs.setdefault(seg.writer, set()).add(seg.seq)
    counts = {}
    for writer, have in seqs.items():
        n = 0
        while n in have:
            n += 1
        counts[writer] = n
    return counts


def list_vouched(store: Store, prefix: str, covered: Iterable[str] = ()
                 ) -> tuple[list[str], LeaseState | None]:
    """List the journal's segments under ``prefix`` (ending ``/``) other than ``covered``;
    return those the newest lease counts, in merge order, and that lease generation.

    The segments are listed before the lease is read, so each listed segment's writer had
    taken a generation no newer than the one read.
    """
    skip = set(covered)
    keys = [k for k in store.list(prefix) if k.endswith(".jsonl") and k not in skip]
    state = newest(store, prefix.rstrip("/"))
    kept, fenced = vouched(keys, state)
    if fenced:
        assert state is not None
        log.warning("%s: %d journal segment(s) of an earlier lease generation landed after "
                    "generation %d took the shard over; they are not counted (fenced out): %s",
                    prefix, len(fenced), state.generation, ", ".join(fenced[:5]))
    return kept, state


def resume_point(store: Store, prefix: str) -> tuple[dict[str, int], LeaseState | None]:
    """Return what the taker of the next lease generation records it resumes from (the
    segments counted now, as ``resumed_counts``), and the newest generation they were
    counted under: take only the generation after that one."""
    prefix = prefix.rstrip("/") + "/"
    index_key = compacted_keys(prefix)[1]
    covered = json.loads(store.read(index_key))["parts"] if store.exists(index_key) else []
    kept, state = list_vouched(store, prefix, covered)
    return resumed_counts([*covered, *kept]), state
