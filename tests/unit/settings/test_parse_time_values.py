"""The deployment settings the DAG file reads when parsed: those three, as the model reads them."""

from __future__ import annotations

import pytest

from include.settings import DeploymentSettings, SettingsError
from include.settings.deployment import PARSE_TIME_SETTINGS, ParseTimeValues


@pytest.mark.parametrize(("raw", "defer"), [("0", False), ("false", False), ("no", False),
                                             ("1", True), ("true", True), ("TRUE", True)])
def test_the_health_gate_flag_reads_as_the_deployment_model_reads_it(monkeypatch, raw,
                                                                     defer) -> None:
    monkeypatch.setenv("REGEN_DEFER_HEALTH_GATE", raw)
    assert DeploymentSettings.parse_time_values().defer_health_gate is defer
    assert DeploymentSettings.load().defer_health_gate is defer


def test_defaults_and_fields_are_the_deployment_models(monkeypatch) -> None:
    monkeypatch.delenv("REGEN_DEFER_HEALTH_GATE", raising=False)
    monkeypatch.delenv("REGEN_MAX_ACTIVE_SHARDS", raising=False)
    monkeypatch.delenv("REGEN_ALLOWED_MODELS", raising=False)
    assert DeploymentSettings.parse_time_values() == ParseTimeValues(3, True,
                                                                     ["Qwen/Qwen3.6-27B"])
    assert set(PARSE_TIME_SETTINGS) == set(ParseTimeValues._fields)
    assert set(PARSE_TIME_SETTINGS) <= set(DeploymentSettings.model_fields)


def test_other_settings_are_not_read_at_parse_time(monkeypatch) -> None:
    # A broken setting the tasks would refuse does not stop the DAG from parsing.
    monkeypatch.setenv("REGEN_PORT_BASE", "5")
    monkeypatch.setenv("REGEN_MAX_ACTIVE_SHARDS", "4")
    assert DeploymentSettings.parse_time_values().max_active_shards == 4
    with pytest.raises(SettingsError):
        DeploymentSettings.load()


def test_a_wrong_value_names_the_setting_its_variable_and_what_is_accepted(monkeypatch) -> None:
    monkeypatch.setenv("REGEN_MAX_ACTIVE_SHARDS", "0")
    with pytest.raises(SettingsError, match=r"`max_active_shards`: got '0'; accepted: >= 1 "
                                            r"\(environment variable REGEN_MAX_ACTIVE_SHARDS\)"):
        DeploymentSettings.parse_time_values()
