"""A wrong setting fails before any work, naming the setting, the value and what is accepted."""

from __future__ import annotations

import dataclasses

import pytest

from include.settings import RunSettings, SettingsError, airflow_params


def test_defaults_are_valid_and_point_at_the_bundled_samples() -> None:
    settings = RunSettings.from_mapping({})
    assert len(settings.sources) >= 6
    assert all(s.path for s in settings.sources)


@pytest.mark.parametrize(
    ("values", "fragments"),
    [
        ({"max_tokens": "lots"}, ["`max_tokens`", "'lots'", "an integer"]),
        ({"max_tokens": 0}, ["`max_tokens`", ">= 1"]),
        ({"temperature": 3}, ["`temperature`", "<= 2.0"]),
        ({"concurrency_mode": "turbo"}, ["`concurrency_mode`", "'turbo'", "['adaptive', 'fixed']"]),
        ({"run_name": "../x"}, ["`run_name`", "lowercase"]),
        ({"shard_sise": 5}, ["unknown setting", "shard_sise", "shard_size"]),
        ({"enable_thinking": "maybe"}, ["`enable_thinking`", "true/false"]),
        ({"sources": [{"name": "a", "path": "x", "kind": "csv"}]},
         ["`sources[0].kind`", "'csv'", "metamathqa"]),
        ({"sources": [{"name": "a", "path": "x", "colour": "red"}]},
         ["`sources[0]`", "colour"]),
        ({"sources": [{"name": "a"}]}, ["`sources` (a)", "path"]),
        ({"sources": [{"name": "a", "path": "x"}, {"name": "a", "path": "y"}]}, ["unique"]),
        ({"context_length": 300, "min_completion_tokens": 290}, ["`context_length`", "no room"]),
        ({"min_in_flight_per_server": 10, "max_in_flight_per_server": 5},
         ["`min_in_flight_per_server`"]),
    ],
)
def test_wrong_settings_are_named_with_value_and_accepted_values(values, fragments) -> None:
    with pytest.raises(SettingsError) as err:
        RunSettings.from_mapping(values)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_values_from_a_form_or_cli_are_coerced() -> None:
    s = RunSettings.from_mapping({"max_tokens": "4096", "enable_thinking": "false",
                                  "dedupe_against": "a.jsonl, b.jsonl", "temperature": 1})
    assert s.max_tokens == 4096 and s.enable_thinking is False
    assert s.dedupe_against == ["a.jsonl", "b.jsonl"] and s.temperature == 1.0


def test_none_means_default_so_empty_form_fields_work() -> None:
    assert RunSettings.from_mapping({"max_prompt_length": None, "seed": None}).seed == 0


def test_round_trip_through_dict() -> None:
    s = RunSettings.from_mapping({"max_tokens": 100, "run_name": "expansion_v1"})
    assert RunSettings.from_mapping(s.to_dict()) == s


def test_fingerprint_changes_only_with_the_named_settings() -> None:
    a = RunSettings.from_mapping({"shard_size": 10})
    b = RunSettings.from_mapping({"shard_size": 10, "max_tokens": 5})
    c = RunSettings.from_mapping({"shard_size": 11})
    assert a.fingerprint(("shard_size",)) == b.fingerprint(("shard_size",))
    assert a.fingerprint(("shard_size",)) != c.fingerprint(("shard_size",))


def test_trigger_form_has_one_typed_param_per_setting() -> None:
    params = airflow_params()
    assert list(params) == [f.name for f in dataclasses.fields(RunSettings)]
    schema = params["max_tokens"].schema
    assert schema["type"] == "integer" and schema["minimum"] == 1
    assert params["concurrency_mode"].schema["enum"] == ["adaptive", "fixed"]
    assert params["tokenizer_path"].schema["type"] == ["string", "null"]
    assert all(p.schema.get("section") and p.schema.get("title") for p in params.values())
    for p in params.values():
        p.resolve(p.value)  # every default passes its own schema (raises if not)


def test_readme_settings_reference_matches_the_settings() -> None:
    from pathlib import Path

    from scripts.settings_reference import END, START, reference

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    block = readme.split(START, 1)[1].split(END, 1)[0]
    assert block.strip() == reference().strip(), (
        "README settings table is stale: run python -m scripts.settings_reference --write "
        "README.md"
    )
