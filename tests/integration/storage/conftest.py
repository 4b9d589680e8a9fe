"""S3 fixtures for the storage integration tests (a real moto_server subprocess)."""

from tests.fixtures.s3 import moto_endpoint, s3_bucket  # noqa: F401
