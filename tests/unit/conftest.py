"""Fixtures shared by unit tiers in more than one folder."""

from __future__ import annotations

# The check_settings tests (pipeline/test_check.py, settings/test_check_settings.py,
# durability/test_journal_settings.py) read one small source from a data root.
from tests.fixtures.check_inputs import data

__all__ = ["data"]
