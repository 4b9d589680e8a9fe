"""Fixtures for the prepare stage: small source files in the exact published schemas."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from include.settings import RunSettings
from tests.fixtures.settings import run_settings


@pytest.fixture
def make_settings(tmp_path: Path) -> Callable[..., RunSettings]:
    """Return a builder of RunSettings writing under tmp_path.

    The test deployment has no source catalogue: every test names its sources with a path,
    also under the bundled samples' names (the catalogue would refuse a path for those).
    """

    def build(sources: list[dict[str, Any]], **run: Any) -> RunSettings:
        """Return run settings of ``sources`` and ``run`` (run settings only)."""
        return run_settings({"sources": sources, "run_name": "t", **run},
                            output_root=str(tmp_path / "out"), source_catalogue={})

    return build
