"""A wrong setting fails before any work, naming the setting, the value and what is accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from include.settings import DeploymentSettings, RunSettings, SettingsError
from include.settings.params import airflow_params
from tests.fixtures.settings import deployment_settings

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def deployment(tmp_path) -> DeploymentSettings:
    return deployment_settings(output_root=str(tmp_path), data_roots=[str(tmp_path)],
                               allowed_models=["Qwen/Qwen3.6-27B", "org/other"])


def test_defaults_are_valid_and_bind_the_bundled_catalogue() -> None:
    settings = RunSettings.from_mapping({})
    assert [s.name for s in settings.sources] == list(DeploymentSettings().source_catalogue)
    assert all(s.path for s in settings.sources)
    assert settings.run_uri.endswith("/var/runs/local")


@pytest.mark.parametrize(
    ("values", "fragments"),
    [
        ({"max_tokens": "lots"}, ["`max_tokens`", "'lots'", "an integer"]),
        ({"max_tokens": 0}, ["`max_tokens`", ">= 1"]),
        ({"temperature": 3}, ["`temperature`", "<= 2"]),
        ({"concurrency_mode": "turbo"}, ["`concurrency_mode`", "'turbo'", "'adaptive'"]),
        ({"run_name": "../x"}, ["`run_name`", "lowercase"]),
        ({"run_name": "ok\n"}, ["`run_name`", "'ok\\n'", "lowercase"]),
        ({"shard_sise": 5}, ["unknown setting `shard_sise`", "did you mean `shard_size`"]),
        ({"enable_thinking": "maybe"}, ["`enable_thinking`", "true or false"]),
        ({"shard_range": "5-2"}, ["`shard_range`", "'5-2'", "backwards", "'2-5'"]),
        ({"shard_range": "a-b"}, ["`shard_range`", "'a-b'", "low-high"]),
        ({"sources": [{"name": "a", "path": "x", "kind": "csv"}]},
         ["`sources[0].kind`", "'csv'", "metamathqa"]),
        ({"sources": [{"name": "a", "path": "x", "colour": "red"}]},
         ["`sources[0].colour`"]),
        ({"sources": [{"name": "a"}]}, ["`sources[0]`", "'a'", "catalogue", "hub_id"]),
        ({"sources": [{"name": "metamath"}]}, ["did you mean `metamathqa`"]),
        ({"sources": [{"name": "a", "hub_id": "x"}, {"name": "a", "hub_id": "y"}]},
         ["unique", "'a'"]),
        ({"context_length": 300, "min_completion_tokens": 290}, ["`context_length`", "no room"]),
        ({"min_in_flight_per_server": 10, "max_in_flight_per_server": 5},
         ["`min_in_flight_per_server`"]),
        ({"model_path": "evil/model"}, ["`model_path`", "'evil/model'", "allowed models",
                                        "REGEN_ALLOWED_MODELS"]),
        ({"reasoning_parser": "qwen3; rm -rf /"}, ["`reasoning_parser`", "a parser name"]),
    ],
)
def test_wrong_settings_are_named_with_value_and_accepted_values(values, fragments) -> None:
    with pytest.raises(SettingsError) as err:
        RunSettings.from_mapping(values)
    for fragment in fragments:
        assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("name", "value", "variable"),
    [
        ("server_launch_command", "sh -c 'echo PWNED-$(id -un) >&2'",
         "REGEN_SERVER_LAUNCH_COMMAND"),
        ("gpu_hosts", [{"host": "10.0.0.9", "ssh_conn_id": "prod", "gpus": [0],
                        "command_prefix": "sh -c id"}], "REGEN_GPU_HOSTS"),
        ("server_log_dir", "/etc", "REGEN_SERVER_LOG_DIR"),
        ("protected_prefixes", [], "REGEN_PROTECTED_PREFIXES"),
        ("output_uri", "s3://bucket/completions/x", "REGEN_OUTPUT_ROOT"),
        ("output_root", "/", "REGEN_OUTPUT_ROOT"),
        ("s3_conn_id", "someone_elses", "REGEN_S3_CONN_ID"),
        ("api_key", "k", "REGEN_SGLANG_CONN_ID"),
        ("data_roots", ["/"], "REGEN_DATA_ROOTS"),
    ],
)
def test_a_conf_naming_a_deployment_setting_is_refused_naming_where_it_is_set(
    name, value, variable
) -> None:
    with pytest.raises(SettingsError) as err:
        RunSettings.from_mapping({name: value})
    assert f"`{name}` is a deployment setting" in str(err.value)
    assert variable in str(err.value)


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(SettingsError) as err:
        RunSettings.from_mapping({"max_tokens": 0, "temperature": 9, "port_base": 1})
    text = str(err.value)
    assert text.startswith("3 settings are wrong")
    assert "`max_tokens`" in text and "`temperature`" in text and "`port_base`" in text


def test_catalogue_sources_keep_their_location_and_take_sampling_overrides(deployment) -> None:
    s = RunSettings.from_mapping({"sources": [{"name": "metamathqa", "quota": 5}]})
    (only,) = s.sources
    assert only.quota == 5 and only.kind == "metamathqa" and only.path.endswith(".json")
    with pytest.raises(SettingsError, match=r"\['path'\] given for a source of the deployment"):
        RunSettings.from_mapping({"sources": [{"name": "metamathqa", "path": "/etc/passwd"}]})


def test_local_paths_must_be_inside_a_data_root(deployment, tmp_path) -> None:
    inside = tmp_path / "data.jsonl"
    inside.write_text("{}\n")
    ok = RunSettings.from_mapping({"sources": [{"name": "mine", "path": str(inside)}]},
                                  deployment)
    assert ok.sources[0].path == str(inside)
    for path in ["/etc/passwd", str(tmp_path / ".." / "elsewhere.jsonl")]:
        with pytest.raises(SettingsError, match="inside the deployment's data roots"):
            RunSettings.from_mapping({"sources": [{"name": "mine", "path": path}]}, deployment)
    link = tmp_path / "link.jsonl"
    link.symlink_to("/etc/hostname")
    with pytest.raises(SettingsError, match="data roots"):
        RunSettings.from_mapping({"sources": [{"name": "mine", "path": str(link)}]}, deployment)
    with pytest.raises(SettingsError, match="`tokenizer_path`"):
        RunSettings.from_mapping({"tokenizer_path": "/etc"}, deployment)
    with pytest.raises(SettingsError, match=r"`dedupe_against\[0\]`"):
        RunSettings.from_mapping({"dedupe_against": ["/etc/passwd"]}, deployment)
    with pytest.raises(SettingsError, match=r"`dedupe_against\[0\]`.*'gs:'.*s3://"):
        RunSettings.from_mapping({"dedupe_against": ["gs://bucket/x"]}, deployment)


def test_deployment_locations_are_normalised_and_checked() -> None:
    d = deployment_settings(output_root="S3://bucket//runs/./x/", protected_prefixes=["a/"])
    assert d.output_root == "s3://bucket/runs/x"
    for bad in (["*/completions"], [""]):
        with pytest.raises(ValueError, match="protected"):
            deployment_settings(protected_prefixes=bad)
    with pytest.raises(ValueError, match="percent-escape"):
        deployment_settings(output_root="s3://bucket/runs%2F..%2Fcompletions")


def test_wrong_deployment_settings_name_their_environment_variable(monkeypatch) -> None:
    monkeypatch.setenv("REGEN_PORT_BASE", "80")
    monkeypatch.setenv("REGEN_GPU_HOSTS", '[{"host": "gpu", "gpus": "all"}]')
    with pytest.raises(SettingsError) as err:
        DeploymentSettings.load()
    text = str(err.value)
    assert "deployment setting `port_base`: got '80'" in text and "REGEN_PORT_BASE" in text
    assert "`gpu_hosts[0].gpus`" in text and "REGEN_GPU_HOSTS" in text


def test_deployment_settings_come_from_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("REGEN_OUTPUT_ROOT", "s3://bucket/runs")
    monkeypatch.setenv("REGEN_ALLOWED_MODELS", '["org/model"]')
    s = RunSettings.from_mapping({"model_path": "org/model", "run_name": "v1"})
    assert s.run_uri == "s3://bucket/runs/v1"
    assert s.deployment.allowed_models == ["org/model"]


def test_values_from_a_form_or_cli_are_coerced() -> None:
    s = RunSettings.from_mapping({"max_tokens": "4096", "enable_thinking": "false",
                                  "temperature": 1})
    assert s.max_tokens == 4096 and s.enable_thinking is False and s.temperature == 1.0


def test_none_means_default_so_empty_form_fields_work() -> None:
    assert RunSettings.from_mapping({"max_prompt_length": None, "seed": None}).seed == 0
    emptied = RunSettings.from_mapping({name: None for name in RunSettings.model_fields})
    assert emptied == RunSettings.from_mapping({})
    for p in airflow_params().values():
        if p.schema["type"] != "boolean":
            p.resolve(None)  # the form accepts an emptied field


def test_an_empty_source_list_means_the_whole_catalogue() -> None:
    assert RunSettings.from_mapping({"sources": []}).sources == RunSettings.from_mapping(
        {}).sources


def test_round_trip_through_dict() -> None:
    s = RunSettings.from_mapping({"max_tokens": 100, "run_name": "expansion_v1",
                                  "sources": [{"name": "codefeedback", "quota": 3}]})
    again = RunSettings.from_mapping(s.to_dict())
    assert again == s and again.sources[0].quota == 3


def test_fingerprint_changes_only_with_the_named_settings() -> None:
    a = RunSettings.from_mapping({"shard_size": 10})
    b = RunSettings.from_mapping({"shard_size": 10, "max_tokens": 5})
    c = RunSettings.from_mapping({"shard_size": 11})
    assert a.fingerprint(("shard_size",)) == b.fingerprint(("shard_size",))
    assert a.fingerprint(("shard_size",)) != c.fingerprint(("shard_size",))


def test_trigger_form_has_one_typed_param_per_run_setting_and_no_deployment_setting() -> None:
    params = airflow_params()
    assert list(params) == list(RunSettings.model_fields)
    assert not set(params) & set(DeploymentSettings.model_fields)
    schema = params["max_tokens"].schema
    # Optional in the form (no required mark): null means the default.
    assert schema["type"] == ["integer", "null"]
    # Issue 34, item 2: no bound the form's number field would clamp a typed value to; the
    # trigger refuses it (allOf) and the description says the range.
    shard = params["shard_size"]
    assert "minimum" not in shard.schema and "maximum" not in shard.schema
    assert shard.schema["allOf"] == [{"minimum": 1, "maximum": 20000}]
    assert shard.description.endswith("Accepted: 1 to 20000.")
    assert params["concurrency_mode"].schema["enum"] == ["adaptive", "fixed", None]
    assert params["enable_thinking"].schema["type"] == "boolean"
    assert params["tokenizer_path"].schema["type"] == ["string", "null"]
    assert params["sources"].schema["items"]["properties"]["kind"]["enum"][0] == "auto"
    from include.quality import QUALITY_FILTERS

    # A multi-select of the filters' names (the form shows one for an array with examples).
    off = params["quality_filters_off"].schema
    assert off["items"]["enum"] == off["examples"] == list(QUALITY_FILTERS)
    assert params["quality_filters_off"].resolve(["near_duplicate"]) == ["near_duplicate"]
    sections = [p.schema["section"] for p in params.values()]
    assert sections.index("Quality gates") > sections.index("Tokenization")
    assert all(p.schema.get("section") and p.schema.get("title") for p in params.values())
    for p in params.values():
        p.resolve(p.value)  # every default passes its own schema (raises if not)


@pytest.mark.parametrize(("name", "bad"), [("run_name", "ok\n"), ("shard_range", "1-"),
                                           ("max_tokens", 0), ("shard_size", 0),
                                           ("sources", [{"kind": "auto"}])])
def test_the_form_refuses_what_the_model_refuses(name, bad) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError):
        airflow_params()[name].resolve(bad)


def test_readme_settings_reference_matches_the_settings() -> None:
    from scripts.settings_reference import END, START, reference

    readme = (ROOT / "docs" / "settings.md").read_text()
    block = readme.split(START, 1)[1].split(END, 1)[0]
    assert block.strip() == reference().strip(), (
        "docs/settings.md is stale: run python -m scripts.settings_reference --write "
        "docs/settings.md"
    )
