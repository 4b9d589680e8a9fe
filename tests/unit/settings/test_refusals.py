"""A refused setting reads as short lines a person finds, and the form's defaults are a run the
deployment accepts (issue 27: the default model was not an allowed one, and the reason was one
long line above a traceback)."""

from __future__ import annotations

import pytest

from include.settings import DeploymentSettings, RunSettings, SettingsError
from include.settings.errors import (
    LINE_WIDTH,
    raise_all,
    refusal_lines,
    refusal_summary,
    refused_names,
)
from include.settings.params import airflow_params, deployment_defaults, settings_reference

LONG = ("setting `model_path`: got 'Qwen/Qwen3.6-27B'; accepted: one of the deployment's "
        "allowed models ['/srv/models/qwen3.6-27b-fp8', '/srv/models/qwen3.6-27b'] "
        "(environment variable REGEN_ALLOWED_MODELS)")


def test_each_problem_is_numbered_and_wrapped_to_short_lines_keeping_every_word() -> None:
    problems = [LONG, "unknown setting `shard_sise` (did you mean `shard_size`?)"]
    lines = refusal_lines(problems)
    assert lines[0] == "2 settings refused:"
    assert lines[1].startswith("1. setting `model_path`") and any(
        line.startswith("2. unknown setting `shard_sise`") for line in lines)
    assert all(len(line) <= LINE_WIDTH for line in lines), lines
    assert len(lines) > 3  # the long sentence took more than one line
    # Nothing lost or reordered: the wrapped lines read back as the sentences.
    assert " ".join(" ".join(lines[1:]).split()) == " ".join(
        f"{i}. {p}" for i, p in enumerate(problems, 1))


def test_the_summary_is_one_short_line_naming_the_settings() -> None:
    summary = refusal_summary([LONG, "deployment setting `gpu_hosts[0].gpus` is empty"])
    assert summary == ("2 settings refused: model_path, gpu_hosts[0].gpus "
                       "(the reasons are in this task's log)")
    assert refused_names(["no name here", "`a` and `b`", "`a` again"]) == ["a"]
    assert "\n" not in refusal_summary([LONG]) and len(refusal_summary([LONG])) < 80


def test_raise_all_keeps_each_problem_for_the_presentation() -> None:
    with pytest.raises(SettingsError) as err:
        raise_all(["setting `a`: bad", "setting `b`: bad"])
    assert err.value.problems == ["setting `a`: bad", "setting `b`: bad"]
    assert SettingsError("setting `c`: bad").problems == ["setting `c`: bad"]


def test_the_forms_default_model_is_the_deployments_first_allowed_model(monkeypatch) -> None:
    monkeypatch.setenv("REGEN_ALLOWED_MODELS", '["/srv/models/a", "/srv/models/b"]')
    assert deployment_defaults() == {"model_path": "/srv/models/a"}
    assert airflow_params()["model_path"].value == "/srv/models/a"
    assert DeploymentSettings.parse_time_values().allowed_models == ["/srv/models/a",
                                                                     "/srv/models/b"]
    assert "the first of `REGEN_ALLOWED_MODELS`" in settings_reference()


def test_a_conf_without_a_model_runs_the_deployments_first_allowed_model() -> None:
    deployment = DeploymentSettings(allowed_models=["/srv/models/a", "/srv/models/b"],
                                    data_roots=["/"])
    assert RunSettings.from_mapping({}, deployment).model_path == "/srv/models/a"
    assert RunSettings.from_mapping({"model_path": None}, deployment).model_path == (
        "/srv/models/a")
    chosen = RunSettings.from_mapping({"model_path": "/srv/models/b"}, deployment)
    assert chosen.model_path == "/srv/models/b"
