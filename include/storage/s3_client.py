"""Where an S3 store's client and bucket come from: an Airflow connection or boto3, and the URI.

Apart from ``s3.py`` (the store itself), which re-exports both.
"""

from __future__ import annotations

from typing import Any

from include.storage.errors import StoreError
from include.storage.locations import parse_location


def split_s3_uri(uri: str) -> tuple[str, str]:
    """Return ``(bucket, key_prefix)`` of ``s3://bucket/a/b``, normalised as every location is
    (``include.storage.locations``); StoreError for anything else."""
    loc = parse_location(uri)
    if loc.scheme != "s3":
        raise StoreError(f"{uri!r} is not an s3:// location")
    return loc.bucket, "/".join(loc.segments)


def make_s3_client(conn_id: str | None = "aws_default", endpoint_url: str | None = None) -> Any:
    """Return a boto3 S3 client: from Airflow's ``S3Hook(conn_id)``, else plain boto3.

    With ``endpoint_url`` given (tests, CLI), a plain client for that endpoint is built with
    credentials from the environment. Otherwise the Airflow connection supplies endpoint,
    region and credentials (``extra.endpoint_url``); without Airflow installed, boto3's default
    chain applies.
    """
    import boto3

    if endpoint_url is None and conn_id:
        try:
            from airflow.providers.amazon.aws.hooks.s3 import S3Hook
        except ImportError:
            pass
        else:
            try:
                return S3Hook(aws_conn_id=conn_id).get_conn()
            except Exception as exc:  # the hook raises AirflowNotFoundException and friends
                raise StoreError(
                    f"cannot build an S3 client from Airflow connection {conn_id!r} "
                    f"({type(exc).__name__}: {exc}); define it (AIRFLOW_CONN_{conn_id.upper()} "
                    "or the Connections UI) with the endpoint URL in its extra"
                ) from exc
    return boto3.client("s3", endpoint_url=endpoint_url)
