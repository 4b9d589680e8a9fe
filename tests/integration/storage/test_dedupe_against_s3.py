"""``dedupe_against`` on S3: read-only, with the run's connection, under a protected prefix too."""

from __future__ import annotations

import json
from typing import Any

import pytest

from include.prompts import PrepareError, prepare_prompts
from include.prompts.dedupe import load_existing_keys
from include.storage import StoreError, check_readable
from synthetic_sources import rows, write_json_array
from tests.fixtures.s3 import Bucket
from tests.fixtures.settings import run_settings

pytestmark = pytest.mark.integration


def _objects(bucket: Bucket) -> dict[str, tuple[bytes, str]]:
    """Return key -> (bytes, ETag) of every object in the bucket."""
    out = {}
    for page in bucket.client.get_paginator("list_objects_v2").paginate(Bucket=bucket.name):
        for obj in page.get("Contents", ()):
            body = bucket.client.get_object(Bucket=bucket.name, Key=obj["Key"])["Body"].read()
            out[obj["Key"]] = (body, obj["ETag"])
    return out


def _seed(bucket: Bucket, records: list[dict[str, Any]]) -> None:
    """Put earlier completions of ``records`` under completions/, in two parts."""
    for part, chunk in enumerate((records[:4], records[4:7])):
        body = "".join(
            json.dumps({"conversations": [{"from": "human", "value": r["query"]},
                                          {"from": "gpt", "value": "old"}]}) + "\n"
            for r in chunk
        )
        bucket.client.put_object(Bucket=bucket.name, Key=f"completions/part-{part}.jsonl",
                                 Body=body.encode())


@pytest.mark.parametrize("where", ["completions/", "completions/part-0.jsonl"])
def test_dedupe_against_protected_completions_reads_them_and_writes_nothing(
    s3_bucket: Bucket, tmp_path, where: str
) -> None:
    source = tmp_path / "mm.json"
    records = list(rows("metamathqa", 20, dup_share=0))
    write_json_array(source, records)
    _seed(s3_bucket, records)
    before = _objects(s3_bucket)
    location = f"{s3_bucket.uri}/{where}"
    settings = run_settings(
        {"sources": [{"name": "mm", "path": str(source)}], "run_name": "t",
         "dedupe_against": [location]},
        source_catalogue={},
        output_root=str(tmp_path / "out"),
        s3_conn_id=s3_bucket.endpoint.conn_id,  # not aws_default: that one is not defined
        dedupe_roots=[f"{s3_bucket.uri}/completions"],
    )
    assert settings.deployment.protected_prefixes == ["completions/"]
    check_readable(location, s3_bucket.endpoint.conn_id)
    manifest = prepare_prompts(settings)
    assert manifest["sources"]["mm"]["dropped"] == {
        "already_in_existing_set": 7 if where == "completions/" else 4
    }
    assert _objects(s3_bucket) == before  # nothing written, in completions/ or anywhere


def test_unreadable_dedupe_locations_are_named_with_what_to_do(s3_bucket: Bucket) -> None:
    conn = s3_bucket.endpoint.conn_id
    with pytest.raises(StoreError, match="does not exist or holds no .jsonl/.json") as err:
        check_readable(f"{s3_bucket.uri}/completions/", conn)
    assert f"{s3_bucket.uri}/completions/" in str(err.value) and repr(conn) in str(err.value)
    with pytest.raises(StoreError, match="bucket 'no-such-bucket-here' does not exist"):
        check_readable("s3://no-such-bucket-here/completions", conn)
    with pytest.raises(StoreError, match="'no_such_connection'"):
        check_readable(f"{s3_bucket.uri}/completions", "no_such_connection")
    settings = run_settings({"dedupe_against": [f"{s3_bucket.uri}/nothing-here"]},
                            s3_conn_id=conn, dedupe_roots=[s3_bucket.uri])
    with pytest.raises(PrepareError, match=r"setting `dedupe_against`: .*nothing-here"):
        load_existing_keys(settings)
