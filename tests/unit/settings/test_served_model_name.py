"""A served model name SGLang exits on (one with ':') is refused by check_settings.

SGLang 0.5.23 asserts at start-up that ``served_model_name`` holds no ':' (it reserves it for
LoRA adapters, ``model:adapter``; ``arg_groups/validation_hook.py``), except for an
object-storage URI, and the name defaults to the model path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from include.pipeline.check_settings import check_settings
from include.settings import SettingsError
from include.settings.params import airflow_params
from tests.fixtures.settings import deployment_settings


@pytest.fixture
def conf(tmp_path: Path) -> dict:
    data = tmp_path / "data"
    data.mkdir()
    (data / "prompts.jsonl").write_text(
        json.dumps({"query": "hi", "answer": "x", "resource": "r"}) + "\n")
    return {"sources": [{"name": "mine", "path": str(data / "prompts.jsonl")}]}


def _check(tmp_path: Path, conf: dict, **values: object):
    model = str(values.get("model_path", "Qwen/Qwen3.6-27B"))
    deployment = deployment_settings(output_root=str(tmp_path / "out"), data_roots=["/"],
                                     allowed_models=[model])
    return check_settings({**conf, **values}, deployment)


def test_a_served_model_name_with_a_colon_is_refused_naming_value_and_what_is_accepted(
    tmp_path, conf
) -> None:
    with pytest.raises(SettingsError) as err:
        _check(tmp_path, conf, served_model_name="qwen:latest")
    text = str(err.value)
    assert "`served_model_name`" in text and "'qwen:latest'" in text
    assert "letters, digits and ._/-" in text and "no ':'" in text and "LoRA" in text
    assert not (tmp_path / "out").exists()


def test_the_form_refuses_a_colon_in_the_served_name_too() -> None:
    from airflow.sdk.exceptions import ParamValidationError

    param = airflow_params()["served_model_name"]
    with pytest.raises(ParamValidationError):
        param.resolve("qwen:latest")
    assert param.resolve("Qwen/Qwen3.6-27B") == "Qwen/Qwen3.6-27B"


def test_a_model_path_with_a_colon_needs_a_served_model_name(tmp_path, conf) -> None:
    with pytest.raises(SettingsError) as err:
        _check(tmp_path, conf, model_path="registry/qwen3:27b")
    text = str(err.value)
    assert "`model_path`" in text and "'registry/qwen3:27b'" in text
    assert "set `served_model_name`" in text and "'qwen3-27b'" in text
    # With a served name of its own, the same model path is fine.
    run = _check(tmp_path, conf, model_path="registry/qwen3:27b", served_model_name="qwen3-27b")
    assert run.model_name == "qwen3-27b"


def test_an_object_storage_model_path_is_a_served_name_sglang_accepts(tmp_path, conf) -> None:
    run = _check(tmp_path, conf, model_path="s3://models/Qwen3.6-27B")
    assert run.model_name == "s3://models/Qwen3.6-27B"
