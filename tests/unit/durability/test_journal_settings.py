"""``check_settings`` refuses a resume whose shards' journals hold other completion settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from include.durability.journal_settings import (
    completion_differences,
    record_shard_settings,
)
from include.layout import (
    MANIFEST_KEY,
    journal_prefix,
    journal_settings_key,
    shard_id,
    started_key,
)
from include.pipeline.check_settings import check_settings
from include.settings import RunSettings, SettingsError
from include.settings.run import COMPLETION_SETTINGS, PREPARATION_SETTINGS
from include.storage import LocalStore
from tests.fixtures.settings import deployment_settings


@pytest.fixture
def conf(data) -> dict:
    return {"sources": [{"name": "mine", "path": str(data / "prompts.jsonl")}],
            "temperature": 0.6}


def _deployment(tmp_path: Path, data: Path):
    return deployment_settings(output_root=str(tmp_path / "out"), data_roots=[str(data)])


def _settings(tmp_path, data, conf, **changes) -> RunSettings:
    return RunSettings.from_mapping({**conf, **changes}, _deployment(tmp_path, data))


def _earlier_run(tmp_path, data, conf, shards: int = 4, journals: range = range(2),
                 **changes) -> LocalStore:
    """Prompt shards prepared and ``journals`` started by a run with ``conf`` + ``changes``,
    as generation leaves them: settings record, started marker, a segment."""
    run = _settings(tmp_path, data, conf, **changes)
    store = LocalStore(run.run_uri)
    store.write_new(MANIFEST_KEY, json.dumps({
        "preparation_fingerprint": run.fingerprint(PREPARATION_SETTINGS),
        "preparation_settings": run.subset(PREPARATION_SETTINGS),
        "shards": [{"shard_id": shard_id(i), "count": 3} for i in range(shards)]}).encode())
    for i in journals:
        record_shard_settings(run, store, shard_id(i))
        store.write_new(started_key(shard_id(i)), b"")
        store.write_new(f"{journal_prefix(shard_id(i))}/part-00000.jsonl", b"{not read}\n")
    return store


def test_a_resume_under_a_changed_temperature_is_refused_naming_the_setting(
        tmp_path, data, conf, monkeypatch) -> None:
    _earlier_run(tmp_path, data, conf)
    read: list[str] = []
    real_read = LocalStore.read
    monkeypatch.setattr(LocalStore, "read", lambda self, key: read.append(key)
                        or real_read(self, key))
    with pytest.raises(SettingsError) as err:
        check_settings({**conf, "temperature": 1.0}, _deployment(tmp_path, data))
    message = str(err.value)
    assert "temperature 0.6 → 1.0" in message
    assert "2 of the chosen shards" in message and "shard-00000, shard-00001" in message
    assert "top_p" not in message  # only what differs is named
    assert "same settings" in message and "`force_regenerate`" in message
    # One listing of journal/, then the manifest and the settings records: no segment read.
    assert not [k for k in read if k.startswith(f"{journal_prefix('')}") and "/part-" in k]
    assert sorted(k for k in read if k.startswith("journal/")) == [
        journal_settings_key("shard-00000"), journal_settings_key("shard-00001")]


def test_the_same_settings_pass_and_so_do_concurrency_and_gates(tmp_path, data, conf) -> None:
    _earlier_run(tmp_path, data, conf)
    check_settings({**conf, "in_flight_per_server": 7, "request_timeout_s": 60.0,
                    "max_failure_rate": 0.5}, _deployment(tmp_path, data))


def test_a_shard_range_leaving_out_the_differing_journals_passes(tmp_path, data, conf) -> None:
    _earlier_run(tmp_path, data, conf)
    check_settings({**conf, "temperature": 1.0, "shard_range": "2-3"},
                   _deployment(tmp_path, data))
    with pytest.raises(SettingsError, match=r"1 of the chosen shards .*shard-00001\)"):
        check_settings({**conf, "temperature": 1.0, "shard_range": "1-3"},
                       _deployment(tmp_path, data))


def test_many_shards_are_named_first_few_then_counted(tmp_path, data, conf) -> None:
    _earlier_run(tmp_path, data, conf, shards=12, journals=range(12))
    with pytest.raises(SettingsError) as err:
        check_settings({**conf, "top_k": 5, "enable_thinking": False},
                       _deployment(tmp_path, data))
    message = str(err.value)
    assert "top_k 20 → 5, enable_thinking true → false (12 shards:" in message
    assert "shard-00004 and 7 more" in message and "shard-00005" not in message


def test_force_regenerate_passes_and_logs_the_differences(tmp_path, data, conf,
                                                          caplog) -> None:
    _earlier_run(tmp_path, data, conf)
    caplog.set_level("INFO")
    check_settings({**conf, "temperature": 1.0, "force_regenerate": True},
                   _deployment(tmp_path, data))
    assert "force_regenerate" in caplog.text and "temperature 0.6 → 1.0" in caplog.text


def test_a_journal_from_before_settings_were_recorded_is_resumed_with_a_warning(
        tmp_path, data, conf, caplog) -> None:
    store = _earlier_run(tmp_path, data, conf, journals=range(0))
    store.write_new(started_key("shard-00003"), b"")  # what a journal of old looks like
    caplog.set_level("WARNING")
    check_settings({**conf, "temperature": 1.0}, _deployment(tmp_path, data))
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("shard-00003" in w and "cannot be told" in w for w in warned), warned


def test_no_prompts_yet_means_nothing_to_compare(tmp_path, data, conf) -> None:
    check_settings({**conf, "temperature": 1.0}, _deployment(tmp_path, data))


def test_the_completion_settings_are_those_the_requests_carry() -> None:
    assert {"temperature", "top_p", "top_k", "max_tokens", "enable_thinking", "model_path",
            "served_model_name", "context_length", "context_margin", "min_completion_tokens",
            "turns"} <= set(COMPLETION_SETTINGS)
    assert not {"in_flight_per_server", "request_timeout_s", "max_sequence_length",
                "max_failure_rate", "tokenizer_path", "shard_range"} & set(COMPLETION_SETTINGS)


def test_a_setting_left_out_at_its_neutral_value_matches_an_older_record(
        tmp_path, data, conf) -> None:
    run = _settings(tmp_path, data, conf)
    old = {"fingerprint": "from-an-older-release",
           "settings": {k: v for k, v in run.subset(COMPLETION_SETTINGS).items() if k != "turns"}}
    assert completion_differences(run, old) == []
    assert completion_differences(_settings(tmp_path, data, conf, turns="all"), old) == [
        'turns "first" → "all"']
