"""What went wrong talking to S3, in words that name the endpoint, bucket, location and fix.

botocore reports a refused credential, a missing bucket or an unreachable endpoint as codes
and exception types; ``S3Store`` turns each into a ``StoreError`` through ``store_error``.
"""

from __future__ import annotations

from include.storage.errors import StoreError

#: Error codes that mean "these credentials may not do this".
CREDENTIAL_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "403",
        "Forbidden",
        "ExpiredToken",
        "InvalidToken",
        "InvalidClientTokenId",
    }
)
#: Error codes of a key (or, without a key, a bucket) that does not exist.
NOT_FOUND_CODES = ("NoSuchKey", "404", "NotFound")
#: Error codes of a store that does not implement what the request asked (botocore gives the
#: bare status when the answer has no XML body).
NOT_IMPLEMENTED_CODES = ("NotImplemented", "501")


class ConditionalConflict(Exception):
    """S3 answered 409 ConditionalRequestConflict: retry the conditional write."""


def error_code(exc: Exception) -> str:
    """Return the S3 error code of a botocore ``ClientError`` ('' for any other exception)."""
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def store_error(
    exc: Exception,
    action: str,
    where: str,
    *,
    endpoint: str,
    bucket: str,
    conn_id: str | None,
    about_bucket: bool,
    conditional: bool = False,
) -> StoreError:
    """Return a StoreError for ``action`` on ``where`` that failed with ``exc``.

    ``about_bucket``: no key was involved, so a 404 means the bucket is missing.
    ``conditional``: the request carried ``If-None-Match: *`` (every write does).
    """
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    if isinstance(exc, NoCredentialsError):
        return StoreError(
            f"{action} {where} at endpoint {endpoint}: no credentials found; set the "
            f"login/password of Airflow connection {conn_id!r} (or AWS credentials)"
        )
    if isinstance(exc, EndpointConnectionError):
        return StoreError(
            f"{action} {where}: cannot reach endpoint {endpoint}; check the "
            f"endpoint_url in the extra of Airflow connection {conn_id!r}"
        )
    if isinstance(exc, ClientError):
        code = error_code(exc)
        if code in ("NoSuchBucket",) or (code in ("404", "NotFound") and about_bucket):
            return StoreError(
                f"{action} {where}: bucket {bucket!r} does not exist at endpoint "
                f"{endpoint}; create it or fix the output location"
            )
        if conditional and code in NOT_IMPLEMENTED_CODES:
            return StoreError(
                f"{action} {where}: the store at endpoint {endpoint} does not support "
                f"conditional writes (it answered {code} to If-None-Match: *). Every write "
                "here is create-only, and without the condition a key could be silently "
                "overwritten, so nothing is written to it. Use a store that supports "
                "If-None-Match on PutObject and CompleteMultipartUpload (AWS S3, or MinIO "
                "RELEASE.2024-11 or newer), or a local output_root"
            )
        if code in CREDENTIAL_CODES:
            return StoreError(
                f"{action} {where}: endpoint {endpoint} refused the credentials for "
                f"bucket {bucket!r} ({code}); check the access key and secret (login/"
                f"password) of Airflow connection {conn_id!r} and that they may read "
                "and write this bucket"
            )
        return StoreError(f"{action} {where} at endpoint {endpoint} failed: {code} {exc}")
    return StoreError(f"{action} {where} at endpoint {endpoint} failed: {exc}")
