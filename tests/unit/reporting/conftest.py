"""Fixtures for report tests: settings and a synthetic run in a local store."""

from __future__ import annotations

import pytest

from include.settings import RunSettings
from include.storage import LocalStore
from tests.fixtures.settings import run_settings


@pytest.fixture
def settings(tmp_path) -> RunSettings:
    """Return settings of a run named ``syn`` under ``tmp_path``."""
    return run_settings({"run_name": "syn"}, output_root=str(tmp_path))


@pytest.fixture
def store(settings) -> LocalStore:
    """Return the run's store."""
    return LocalStore(settings.run_uri)
