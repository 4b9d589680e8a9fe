"""Prompt shards an earlier run prepared: reused under the same preparation settings, refused
under others (``prompts/plan.py``; the task's plan is in
``tests/unit/pipeline/test_prepare_prompts.py``)."""

from __future__ import annotations

import pytest

from include.pipeline.binding import open_run_store
from include.prompts import PrepareError
from include.prompts.plan import prepare_or_reuse
from include.settings import RunSettings
from tests.fixtures.settings import run_settings


def _changed(settings: RunSettings, **changes) -> RunSettings:
    """Return ``settings`` with run settings changed, on the same deployment."""
    return RunSettings.from_mapping({**settings.to_dict(), **changes}, settings.deployment)


@pytest.fixture
def settings(tmp_path) -> RunSettings:
    return run_settings({"run_name": "r", "shard_size": 60}, output_root=str(tmp_path))


def test_plan_refuses_shards_prepared_with_other_settings(settings) -> None:
    prepare_or_reuse(settings, open_run_store(settings))
    other = _changed(settings, seed=5)
    with pytest.raises(PrepareError, match=r"different: \['seed'\]"):
        prepare_or_reuse(other, open_run_store(other))
