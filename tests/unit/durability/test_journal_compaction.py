"""A published shard's journal as one object: the same records, one read instead of many."""

from __future__ import annotations

import json

from include.durability.journal import StoreJournal, compact, load_journal_records, read_segments
from include.generation.shard import publish_shard
from include.layout import compacted_keys, journal_prefix, shard_key
from include.prompts.encoding import encode_record
from include.storage import LocalStore

SHARD = "shard-00000"
PREFIX = journal_prefix(SHARD)


class CountingStore(LocalStore):
    """A local store that counts reads, as S3 would bill GETs."""

    reads = 0

    def read(self, key: str) -> bytes:
        self.reads += 1
        return super().read(key)


def _journal_in_segments(store, records) -> None:
    for rec in records:  # one segment per line, as a slow trickle of finished prompts writes
        journal = StoreJournal(store, PREFIX)
        journal.append(rec)
        journal.close()


RECORDS = [
    {"id": "p:0", "status": "failed", "reason": "http_5xx", "detail": "outage"},
    {"id": "p:1", "status": "skipped", "reason": "prompt_too_long"},
    {"id": "p:0", "status": "skipped", "reason": "prompt_too_long"},  # replaces the 5xx
    {"id": "p:1", "status": "skipped", "reason": "a later line loses"},
    {"id": "p:2", "status": "skipped", "reason": "prompt_too_long"},
]


def test_a_compacted_journal_loads_the_same_records_in_one_read(tmp_path) -> None:
    store = CountingStore(tmp_path)
    _journal_in_segments(store, RECORDS)
    before = load_journal_records(store, SHARD)
    assert compact(store, PREFIX) is True
    assert compact(store, PREFIX) is False  # once
    store.reads = 0
    after = load_journal_records(store, SHARD)
    assert after == before  # first final record wins, a retryable failure gives way
    assert after["p:0"]["status"] == "skipped" and after["p:1"]["reason"] == "prompt_too_long"
    assert store.reads == 2  # index and object, not one read per segment
    data_key, index_key = compacted_keys(PREFIX)
    index = json.loads(store.read(index_key))
    assert len(index["parts"]) == len(RECORDS) and index["bytes"] == len(store.read(data_key))
    # Beside the journal folder: whoever reads every key in it as segments sees none of it.
    assert not any(k.startswith(PREFIX + "/") for k in (data_key, index_key))


def test_a_segment_written_after_compaction_is_still_merged(tmp_path) -> None:
    store = LocalStore(tmp_path)
    _journal_in_segments(store, RECORDS[:2])
    compact(store, PREFIX)
    _journal_in_segments(store, [{"id": "p:0", "status": "skipped", "reason": "late"}])
    keys = [k for k, _ in read_segments(store, PREFIX)]
    assert keys[0] == compacted_keys(PREFIX)[0] and len(keys) == 2
    assert load_journal_records(store, SHARD)["p:0"]["reason"] == "late"


def test_publishing_a_shard_compacts_its_journal(tmp_path) -> None:
    store = LocalStore(tmp_path)
    prompts = [{"id": f"p:{i}", "source": "t", "metadata": {},
                "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(3)]
    store.write_new(shard_key(0), b"".join(encode_record(p) for p in prompts))
    _journal_in_segments(store, RECORDS)
    manifest = publish_shard(SHARD, store)
    assert manifest["counts"]["skipped"] == 3
    assert store.exists(compacted_keys(PREFIX)[1])
    assert publish_shard(SHARD, store) == manifest  # a retry: published and compacted as is
