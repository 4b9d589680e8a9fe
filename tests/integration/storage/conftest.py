"""S3 fixtures for the storage integration tests (real moto_server subprocesses)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.fixtures.check_inputs import data  # noqa: F401
from tests.fixtures.s3 import moto_endpoint, s3_bucket  # noqa: F401
from tests.integration.storage.s3_proxy import PASS, ProxiedStore, always, proxied_store


@pytest.fixture(scope="session")
def _proxied_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxiedStore]:
    with proxied_store(tmp_path_factory.mktemp("proxy")) as store:
        yield store


@pytest.fixture
def proxied(_proxied_endpoint: ProxiedStore) -> Iterator[tuple[ProxiedStore, str]]:
    """The misbehaving-on-request store (``s3_proxy``), passing everything, and a fresh bucket."""
    _proxied_endpoint.rule = always(PASS)
    _proxied_endpoint.seen.clear()
    name = f"regen-{uuid.uuid4().hex[:12]}"
    _proxied_endpoint.client().create_bucket(Bucket=name)
    yield _proxied_endpoint, name
    _proxied_endpoint.rule = always(PASS)
