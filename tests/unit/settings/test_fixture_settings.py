"""The tests' settings fixture gives run and deployment settings apart, as production does:
what production refuses in a trigger conf, the fixture refuses in its run mapping."""

from __future__ import annotations

import pytest

from include.settings import RunSettings, SettingsError
from tests.fixtures.settings import DEPLOYMENT_KEYS, run_settings


@pytest.mark.parametrize(("key", "value"), [
    ("gpu_hosts", [{"host": "127.0.0.1", "gpus": [0]}]), ("port_base", 31000),
    ("output_root", "/tmp/out"), ("api_key", "k-1"), ("source_catalogue", {}),
])
def test_a_deployment_setting_in_the_run_mapping_is_a_type_error_saying_pass_a_keyword(
    key, value
) -> None:
    with pytest.raises(TypeError) as err:
        run_settings({"run_name": "r", key: value})
    assert repr(key) in str(err.value) and f"{key}=..." in str(err.value)
    bound = run_settings({"run_name": "r"}, **{key: value})  # as a keyword: bound
    assert bound.run_name == "r"


def test_output_uri_is_no_alias_and_names_output_root() -> None:
    with pytest.raises(TypeError, match="old name of the deployment setting 'output_root'"):
        run_settings({"output_uri": "/tmp/out"})
    with pytest.raises(ValueError, match="output_uri"):  # nor a deployment keyword
        run_settings(output_uri="/tmp/out")
    assert run_settings(output_root="/tmp/out").deployment.output_root == "/tmp/out"


def test_the_fixture_refuses_what_production_refuses_in_a_trigger_conf() -> None:
    for key in sorted(DEPLOYMENT_KEYS):
        with pytest.raises(SettingsError, match=f"`{key}` is a deployment setting"):
            RunSettings.from_mapping({key: None if key == "api_key" else "x"})
