"""S3 failures in words: which endpoint, bucket and connection, and what to fix."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from include.storage.s3_errors import error_code, store_error

WHERE = {"endpoint": "http://s3.test:9000", "bucket": "data", "conn_id": "regen_s3"}


def client_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}}, "HeadObject")


def test_the_code_is_read_from_client_errors_only() -> None:
    assert error_code(client_error("NoSuchKey")) == "NoSuchKey"
    assert error_code(RuntimeError("x")) == ""


@pytest.mark.parametrize(
    ("exc", "about_bucket", "words"),
    [
        (NoCredentialsError(), False, "no credentials found; set the login/password of Airflow "
                                      "connection 'regen_s3'"),
        (EndpointConnectionError(endpoint_url="http://s3.test:9000"), False,
         "cannot reach endpoint http://s3.test:9000; check the endpoint_url"),
        (client_error("NoSuchBucket"), False, "bucket 'data' does not exist at endpoint"),
        (client_error("404"), True, "bucket 'data' does not exist at endpoint"),
        (client_error("AccessDenied"), False, "refused the credentials for bucket 'data' "
                                              "(AccessDenied)"),
        (client_error("SlowDown"), False, "at endpoint http://s3.test:9000 failed: SlowDown"),
        (RuntimeError("boom"), False, "at endpoint http://s3.test:9000 failed: boom"),
    ],
)  # fmt: skip
def test_each_failure_names_what_to_fix(exc: Exception, about_bucket: bool, words: str) -> None:
    err = store_error(exc, "reading", "s3://data/k", about_bucket=about_bucket, **WHERE)
    assert str(err).startswith("reading s3://data/k") and words in str(err)


def test_a_missing_key_is_not_reported_as_a_missing_bucket() -> None:
    err = store_error(client_error("404"), "reading", "s3://data/k", about_bucket=False, **WHERE)
    assert "does not exist" not in str(err) and "failed: 404" in str(err)


@pytest.mark.parametrize("code", ["NotImplemented", "501"])  # "501": an answer without XML
def test_a_store_without_conditional_writes_is_told_so(code: str) -> None:
    err = store_error(client_error(code), "writing", "s3://data/k", about_bucket=False,
                      conditional=True, **WHERE)
    assert str(err).startswith(
        "writing s3://data/k: the store at endpoint http://s3.test:9000 does not support "
        f"conditional writes (it answered {code} to If-None-Match: *)")
    assert "Use a store that supports If-None-Match" in str(err)
    # A request without the condition that the store did not implement is another problem.
    plain = store_error(client_error(code), "reading", "s3://data/k", about_bucket=False,
                        **WHERE)
    assert "conditional" not in str(plain) and f"failed: {code}" in str(plain)
