"""Issue 26.2: a holder that lost its lease gets no write into the output.

A holder paused between its last lease check and a segment PUT (a cut network, SIGSTOP)
lands that segment after the next generation took the shard over. Before, readers merged
every segment in key order, and keys start with the writer's wall clock, so the stale
segment (its key from before the pause, or from a slow clock) won over the new holder's
records. Here the stale writer is simulated: its segment is written, under the key its
journal would have used, after the takeover. The scenarios use only names the code before
had too (the key format is the documented one), so they fail there by what they do.
"""

from __future__ import annotations

import json
import time

import pytest

from include.durability import journal as journal_module
from include.durability.claims import wait_for_turn
from include.durability.journal import StoreJournal, load_journal_records
from include.durability.lease import LeaseState
from include.generation.shard import publish_shard
from include.layout import journal_prefix, lease_key, shard_key
from include.prompts.encoding import encode_record
from include.storage import LocalStore

SHARD = "shard-00000"
PREFIX = journal_prefix(SHARD)
HOUR_NS = 3600 * 10**9


def _prompts(store: LocalStore, n: int) -> list[str]:
    ids = [f"p:{i}" for i in range(n)]
    store.write_new(shard_key(0), b"".join(
        encode_record({"id": i, "source": "t", "metadata": {},
                       "messages": [{"role": "user", "content": i}]}) for i in ids))
    return ids


def _done(pid: str, who: str) -> dict:
    return {"id": pid, "status": "completed", "text": f"by {who}", "server": who,
            "finish_reason": "stop", "source": "t"}


def _take(store: LocalStore, run_id: str, ttl_s: float = 60.0):
    """The next generation, as a generate try takes it (the one before expired or released).

    ``ttl_s`` is the one the taker declares: short for the holder about to be paused."""
    return wait_for_turn(store, SHARD, PREFIX, run_id, lambda r: True, lambda: False,
                         poll_s=0.02, ttl_s=ttl_s)


def _writer(store: LocalStore, lease, fenced: bool = True) -> StoreJournal:
    """A holder's journal; ``fenced=False``: a stale holder, past its last lease check."""
    return StoreJournal(store, PREFIX, fence=lease.check if fenced else None,
                        tag=f"{lease.generation:08d}")


def _late_segment(journal: StoreJournal, records: list[dict], clock_ns: int) -> tuple[str,
                                                                                      bytes]:
    """The key and bytes of ``journal``'s next PUT, its key stamped ``clock_ns``: what a
    holder paused after its last check sends when it wakes."""
    key = f"{journal.prefix}part-{clock_ns:020d}-{journal._writer}-{journal._seq:06d}.jsonl"
    return key, b"".join(json.dumps(r).encode() + b"\n" for r in records)


@pytest.mark.parametrize("stale_skew_ns", [0, -HOUR_NS, HOUR_NS])
@pytest.mark.parametrize("new_skew_ns", [0, -HOUR_NS, HOUR_NS])
def test_a_segment_landing_after_the_takeover_never_reaches_the_output(
        tmp_path, monkeypatch, stale_skew_ns, new_skew_ns) -> None:
    store = LocalStore(tmp_path)
    ids = _prompts(store, 4)
    old = _take(store, "run-1", ttl_s=0.2)
    old.stop()  # paused: no more renewals; its journal already holds p:0 and p:1
    stale = _writer(store, old, fenced=False)
    for pid in ids[:2]:
        stale.append(_done(pid, "old"))
    stale.flush()
    # The PUT it had started (key stamped before the pause, by its own clock) is in flight.
    late = _late_segment(stale, [_done(pid, "old") for pid in ids[2:]],
                         time.time_ns() + stale_skew_ns)
    new = _take(store, "run-2")
    assert new is not None and new.generation == 2
    real = time.time_ns
    monkeypatch.setattr(journal_module.time, "time_ns", lambda: real() + new_skew_ns)
    journal = _writer(store, new)
    # The stale PUT lands after the takeover, before the new holder reads the journal ...
    store.write_new(*late)
    resumed = journal.load()
    assert sorted(resumed) == ids[:2]  # ... and is not resumed: p:2 and p:3 are redone
    for pid in ids[2:]:
        journal.append(_done(pid, "new"))
    journal.close()
    manifest = publish_shard(SHARD, store, generation={"lease": new.token})
    rows = {json.loads(x)["id"]: json.loads(x) for x in
            store.read("generated/shard-00000.jsonl").splitlines()}
    assert {pid: r["server"] for pid, r in rows.items()} == {
        "p:0": "old", "p:1": "old", "p:2": "new", "p:3": "new"}
    assert manifest["lease"]["generation"] == 2
    # Whoever reads the journal later (the report, a compacted read) sees the same.
    assert {pid: r["server"] for pid, r in load_journal_records(store, SHARD).items()} == {
        pid: r["server"] for pid, r in rows.items()}


def test_a_segment_landing_after_the_new_holder_wrote_is_fenced_out_too(tmp_path) -> None:
    store = LocalStore(tmp_path)
    ids = _prompts(store, 2)
    old = _take(store, "run-1", ttl_s=0.2)
    old.stop()
    stale = _writer(store, old, fenced=False)
    late = _late_segment(stale, [_done(pid, "old") for pid in ids], time.time_ns())
    new = _take(store, "run-2")
    journal = _writer(store, new)
    for pid in ids:
        journal.append(_done(pid, "new"))
    journal.flush()
    store.write_new(*late)  # the new holder's records are in the store first this time
    journal.close()
    publish_shard(SHARD, store, generation={"lease": new.token})
    rows = [json.loads(x) for x in store.read("generated/shard-00000.jsonl").splitlines()]
    assert [r["server"] for r in rows] == ["new", "new"]


def test_turn_records_of_a_stale_holder_are_fenced_out(tmp_path) -> None:
    """``turns: all``: the stale holder's next turn and final record of a conversation land
    after the takeover; the new holder continues from the turn it resumed, and publishes its
    own turn and record."""
    store = LocalStore(tmp_path)
    store.write_new(shard_key(0), encode_record(
        {"id": "chat:0", "source": "t", "metadata": {}, "turns": "all",
         "messages": [{"role": "user", "content": "q0"}, {"role": "assistant", "content": "a"},
                      {"role": "user", "content": "q1"}]}))

    def turn(k: int, who: str) -> dict:
        return {"id": f"chat:0#turn-{k}@{who}{k}", "kind": "conversation_turn",
                "status": "completed", "conversation_id": "chat:0", "turn": k,
                "digest": f"{who}{k}", "server": who}

    def final(who: str) -> dict:
        return {**_done("chat:0", who), "turns": "all",
                "turn_results": [{"index": 0, "server": "old"}, {"index": 2, "server": who}]}

    old = _take(store, "run-1", ttl_s=0.2)
    old.stop()
    stale = _writer(store, old, fenced=False)
    stale.append(turn(0, "old"))
    stale.flush()
    late = _late_segment(stale, [turn(2, "old"), final("old")], time.time_ns() - HOUR_NS)
    new = _take(store, "run-2")
    journal = _writer(store, new)
    store.write_new(*late)
    assert sorted(journal.load()) == ["chat:0#turn-0@old0"]  # the turn it continues from
    journal.append(turn(2, "new"))
    journal.append(final("new"))
    journal.close()
    publish_shard(SHARD, store, generation={"lease": new.token})
    row = json.loads(store.read("generated/shard-00000.jsonl"))
    assert [t["server"] for t in row["turn_results"]] == ["old", "new"]
    kept = StoreJournal(store, PREFIX).load()
    assert "chat:0#turn-2@old2" not in kept and kept["chat:0#turn-2@new2"]["server"] == "new"


def test_each_generation_records_the_segments_it_resumes_from(tmp_path) -> None:
    from include.durability.fencing import resume_point

    store = LocalStore(tmp_path)
    first = _take(store, "run-1")
    journal = _writer(store, first)
    journal.append(_done("p:0", "a"))
    journal.flush()
    journal.append(_done("p:1", "a"))
    journal.close()
    first.release(complete=False)
    second = _take(store, "run-1")
    body = json.loads(store.read(lease_key(PREFIX, 2)))
    assert body["segments"] == {journal._writer: 2}
    counts, seen = resume_point(store, PREFIX)
    assert seen is not None and seen.generation == 2 and counts == {journal._writer: 2}
    assert second.generation == 2


def test_what_a_segment_key_says_and_who_is_never_fenced() -> None:
    from include.durability.fencing import parse_segment, vouched
    from include.layout import segment_key

    tagged = segment_key("journal/s/", 5, "00000003" + "ab" * 6, 7)
    assert parse_segment(tagged) == parse_segment(tagged).__class__(3, "00000003" + "ab" * 6, 7)
    untagged = segment_key("journal/s/", 5, "123456789abc", 0)  # a run without a lease
    assert parse_segment(untagged).generation == 0
    assert parse_segment("journal/s/started") is None
    w1, w2 = "00000001" + "a" * 12, "00000002" + "b" * 12
    keys = [segment_key("j/", 9, w1, 0), segment_key("j/", 1, w2, 0), segment_key("j/", 8, w1, 1),
            untagged]
    state = LeaseState(2, {"segments": {w1: 1}}, None)
    kept, fenced = vouched(keys, state)
    # Merge order is generation, then key: the new holder's early clock decides nothing.
    assert kept == [untagged, keys[0], keys[1]] and fenced == [keys[2]]
    # A lease taken by a release before the rule (no "segments") fences nothing.
    assert vouched(keys, LeaseState(2, {}, None))[1] == []
    assert vouched(keys, None)[1] == []

