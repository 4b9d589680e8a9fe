"""The create-only probe against a real S3 endpoint, and against one that ignores If-None-Match.

The second store is moto with the condition stripped from every PutObject before it is sent:
what an older MinIO or another S3-compatible store does with it. Its writes succeed and its
checksums verify, so only a probe can tell.
"""

from __future__ import annotations

from typing import Any

import pytest

from include.storage import S3Store, StoreError
from include.storage.probe import PROBE_FOLDER, prove_create_only
from tests.fixtures.s3 import Bucket

pytestmark = pytest.mark.integration


def _ignoring_condition(client: Any) -> Any:
    def strip(params: dict[str, Any], **_: Any) -> None:
        params.pop("IfNoneMatch", None)

    client.meta.events.register("before-parameter-build.s3.PutObject", strip)
    return client


def test_a_store_that_honours_the_condition_is_proven_once(s3_bucket: Bucket) -> None:
    store = S3Store(f"{s3_bucket.uri}/runs", client=s3_bucket.endpoint.client())
    assert prove_create_only(store) == "probed now"
    assert prove_create_only(store) == "proven before"  # cached per root and endpoint
    keys = store.list(PROBE_FOLDER)
    assert len([k for k in keys if "/probe-" in k]) == 1
    assert len([k for k in keys if "/proven-" in k]) == 1
    # Another root of the same bucket is another store: probed on its own.
    other = S3Store(f"{s3_bucket.uri}/elsewhere", client=s3_bucket.endpoint.client())
    assert prove_create_only(other) == "probed now"


def test_a_store_that_overwrites_is_refused_and_named(s3_bucket: Bucket) -> None:
    store = S3Store(f"{s3_bucket.uri}/runs",
                    client=_ignoring_condition(s3_bucket.endpoint.client()))
    # One write looks fine on such a store: it succeeds and its checksum verifies.
    assert store.write_new("generated/a.jsonl", b"first\n") is True
    with pytest.raises(StoreError) as err:
        prove_create_only(store)
    message = str(err.value)
    assert "overwrote an existing key" in message and s3_bucket.endpoint.url in message
    assert f"{s3_bucket.uri}/runs" in message and "another output_root" in message
    assert not [k for k in store.list(PROBE_FOLDER) if "/proven-" in k]  # no marker left


def test_a_local_directory_is_create_only_by_construction(tmp_path) -> None:
    from include.storage import LocalStore

    assert prove_create_only(LocalStore(tmp_path)) == "create-only by construction"


def test_check_settings_probes_an_s3_output_root_once(s3_bucket: Bucket, tmp_path) -> None:
    from include.pipeline.check import check_settings
    from tests.fixtures.settings import deployment_settings

    data = tmp_path / "data"
    data.mkdir()
    (data / "p.jsonl").write_text('{"query": "hi", "answer": "x", "resource": "r"}\n')
    dep = deployment_settings(output_root=f"{s3_bucket.uri}/runs",
                              s3_conn_id=s3_bucket.endpoint.conn_id,
                              allowed_models=["Qwen/Qwen3.6-27B"], data_roots=[str(data)])
    conf = {"sources": [{"name": "mine", "path": str(data / "p.jsonl")}]}
    check_settings(conf, dep)
    check_settings(conf, dep)
    store = S3Store(f"{s3_bucket.uri}/runs", client=s3_bucket.endpoint.client())
    keys = store.list(PROBE_FOLDER)
    assert len(keys) == 2 and sum("/proven-" in k for k in keys) == 1  # one probe, one marker
