"""``S3Store.list_children`` against a real S3 endpoint (moto_server): the delimiter listing."""

from __future__ import annotations

import pytest

from include.storage import LocalStore, S3Store
from tests.fixtures.s3 import Bucket

pytestmark = pytest.mark.integration

KEYS = ["journal/shard-00000/started", "journal/shard-00000/part-1.jsonl",
        "journal/shard-00000/lease/00000001.json", "journal/shard-00000.settings.json",
        "journal/shard-00001/part-1.jsonl", "journal/shard-00001.compacted.json",
        "journal/shard-00002/part-1.jsonl", "generated/shard-00000.manifest.json", "top.json"]


def test_s3_lists_one_level_across_pages_as_the_local_store_does(s3_bucket: Bucket,
                                                                 tmp_path) -> None:
    client = s3_bucket.endpoint.client()
    s3 = S3Store(f"{s3_bucket.uri}/runs/r1", client=client)
    local = LocalStore(tmp_path / "r1")
    for key in KEYS:
        s3.write_new(key, b"x")
        local.write_new(key, b"x")
    # A neighbour whose name starts like the folder (not in it), and a console's folder marker.
    s3.write_new("journal-old/x", b"x")
    local.write_new("journal-old/x", b"x")
    client.put_object(Bucket=s3_bucket.name, Key="runs/r1/journal/", Body=b"")
    calls: list[str] = []
    client.meta.events.register("before-call.s3.ListObjectsV2",
                                lambda **kw: calls.append("list"))
    for prefix in ("journal/", "journal", "", "journal/shard-00000", "missing/"):
        calls.clear()
        got = s3.list_children(prefix, page_size=2)  # many pages: merged, prefixes kept
        assert got == local.list_children(prefix), prefix
    assert s3.list_children("journal/")[1] == [
        "journal/shard-00000/", "journal/shard-00001/", "journal/shard-00002/"]
    calls.clear()
    keys, subs = s3.list_children("journal/")
    assert len(calls) == 1 and len(keys) + len(subs) == 5  # one LIST for the whole level
