"""Fixtures for monitor tests: the report tests' settings and synthetic run store."""

from tests.unit.reporting.conftest import settings, store

__all__ = ["settings", "store"]
