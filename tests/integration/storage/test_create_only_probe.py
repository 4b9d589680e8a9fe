"""The create-only probe, on every run and where the run writes, against stores that misbehave.

A real S3 endpoint (moto_server) honours ``If-None-Match``. The others are moto behind a
loopback proxy (``s3_proxy``) that drops the header (an older MinIO, a gateway), only on
CompleteMultipartUpload, only under one prefix, or answers 501: their writes succeed and
their checksums verify, so only a probe can tell.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from include.settings import SettingsError
from include.storage import S3Store, StoreError
from include.storage.probe import PROBE_FOLDER, prove_create_only
from tests.fixtures.check_inputs import check_deployment
from tests.fixtures.s3 import Bucket
from tests.integration.storage.s3_proxy import (
    DROP,
    REFUSE,
    ProxiedStore,
    always,
    on_completion,
    under,
)

pytestmark = pytest.mark.integration
CONF = {"run_name": "r1"}


def _ignoring_condition(client: Any) -> Any:
    def strip(params: dict[str, Any], **_: Any) -> None:
        params.pop("IfNoneMatch", None)

    client.meta.events.register("before-parameter-build.s3.PutObject", strip)
    return client


def _proxied_store(proxied: tuple[ProxiedStore, str], prefix: str = "out/r1") -> S3Store:
    endpoint, bucket = proxied
    return S3Store(f"s3://{bucket}/{prefix}", client=endpoint.client())


def _check(tmp_path: Path, data: Path, output_root: str, conn_id: str) -> Any:
    from include.pipeline.check_settings import check_settings

    conf = {**CONF, "sources": [{"name": "mine", "path": str(data / "prompts.jsonl")}]}
    dep = check_deployment(tmp_path, data, output_root=output_root, s3_conn_id=conn_id,
                           allowed_models=["Qwen/Qwen3.6-27B"])
    return check_settings(conf, dep)


def test_a_store_that_honours_the_condition_is_probed_on_every_run(s3_bucket: Bucket) -> None:
    store = S3Store(f"{s3_bucket.uri}/runs", client=s3_bucket.endpoint.client())
    first, second = prove_create_only(store), prove_create_only(store)
    assert first.startswith("probed now at ") and second.startswith("probed now at ")
    keys = store.list(PROBE_FOLDER)
    assert sorted(keys) == sorted(how.rsplit("/runs/", 1)[1] for how in (first, second))
    assert all(store.read(k).startswith(b'{"at": ') for k in keys)  # the first bytes stayed
    assert not s3_bucket.client.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads")


def test_a_store_that_overwrites_is_refused_and_named(s3_bucket: Bucket) -> None:
    store = S3Store(f"{s3_bucket.uri}/runs",
                    client=_ignoring_condition(s3_bucket.endpoint.client()))
    # One write looks fine on such a store: it succeeds and its checksum verifies.
    assert store.write_new("generated/a.jsonl", b"first\n") is True
    with pytest.raises(StoreError) as err:
        prove_create_only(store)
    message = str(err.value)
    assert "overwrote an existing key on PutObject" in message
    assert s3_bucket.endpoint.url in message
    assert f"{s3_bucket.uri}/runs" in message and "another output_root" in message


def test_a_store_that_ignores_the_condition_on_completion_is_refused(proxied) -> None:
    endpoint, _ = proxied
    endpoint.rule = on_completion(DROP)
    store = _proxied_store(proxied)
    with pytest.raises(StoreError) as err:
        prove_create_only(store)
    message = str(err.value)
    assert "overwrote an existing key on CompleteMultipartUpload" in message
    assert "two racing large (multipart) writes of one key would both succeed" in message
    assert any(line.startswith("POST ") and "uploadId=" in line and line.endswith(DROP)
               for line in endpoint.seen)  # the completion did ask the condition


def test_a_store_without_conditional_writes_is_named_with_what_to_do(proxied) -> None:
    endpoint, _ = proxied
    endpoint.rule = always(REFUSE)
    store = _proxied_store(proxied)
    for attempt in (lambda: prove_create_only(store),
                    lambda: store.write_new("generated/a.jsonl", b"x\n")):
        with pytest.raises(StoreError) as err:
            attempt()
        message = str(err.value)
        assert f"the store at endpoint {endpoint.url} does not support conditional writes" in (
            message)
        assert "answered NotImplemented to If-None-Match: *" in message
        assert "Use a store that supports If-None-Match" in message
        assert "or a local output_root" in message and "An error occurred" not in message


def test_a_local_directory_is_create_only_by_construction(tmp_path) -> None:
    from include.storage import LocalStore

    assert prove_create_only(LocalStore(tmp_path)) == "create-only by construction"


def test_check_settings_probes_in_the_run_location_on_every_run(
        s3_bucket: Bucket, tmp_path: Path, data: Path) -> None:
    root = f"{s3_bucket.uri}/out"
    for _ in range(2):
        _check(tmp_path, data, root, s3_bucket.endpoint.conn_id)
    store = S3Store(root, client=s3_bucket.endpoint.client())
    keys = store.list("")
    assert len(keys) == 2 and all(k.startswith(f"r1/{PROBE_FOLDER}/") for k in keys)


def test_check_settings_refuses_a_proven_store_put_behind_a_header_dropping_proxy(
        proxied, tmp_path: Path, data: Path) -> None:
    endpoint, bucket = proxied
    _check(tmp_path, data, f"s3://{bucket}/out", endpoint.conn_id)  # proven today
    endpoint.rule = always(DROP)  # tomorrow, the same endpoint drops the header
    with pytest.raises(SettingsError) as err:
        _check(tmp_path, data, f"s3://{bucket}/out", endpoint.conn_id)
    message = str(err.value)
    assert "deployment setting `output_root`" in message and f"s3://{bucket}/out/r1" in message
    assert "overwrote an existing key on PutObject" in message


def test_check_settings_probes_where_the_run_writes_not_beside_it(
        proxied, tmp_path: Path, data: Path) -> None:
    endpoint, bucket = proxied
    endpoint.rule = under("out/r1/", DROP)  # a policy or gateway rule for one prefix
    with pytest.raises(SettingsError, match="overwrote an existing key on PutObject"):
        _check(tmp_path, data, f"s3://{bucket}/out", endpoint.conn_id)


def test_check_settings_names_a_store_without_conditional_writes(
        proxied, tmp_path: Path, data: Path) -> None:
    endpoint, bucket = proxied
    endpoint.rule = always(REFUSE)
    with pytest.raises(SettingsError) as err:
        _check(tmp_path, data, f"s3://{bucket}/out", endpoint.conn_id)
    assert "does not support conditional writes" in str(err.value)
