"""The generate task records a shard's completion settings and refuses a resume under others."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from include.durability.journal_settings import JournalSettingsError
from include.generation import shard as shard_stage
from include.generation.shard import generate_shard, publish_shard
from include.layout import journal_settings_key, regeneration_prefix, shard_key, started_key
from include.pipeline import generate as generate_task
from include.pipeline.binding import outputs_uri
from include.prompts.encoding import encode_record
from include.settings import RunSettings
from include.settings.run import COMPLETION_SETTINGS
from include.storage import LocalStore
from tests.fixtures.settings import deployment_env, deployment_settings

SHARD = "shard-00000"
PROMPTS = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}],
            "source": "mine"} for i in range(2)]


@pytest.fixture
def engine(monkeypatch) -> list[str]:
    """A stand-in engine: each prompt completed at once; returns the shards it ran."""
    ran: list[str] = []

    def run_shard(shard_id, prompts, servers, journal, config, prompt_tokens):
        ran.append(shard_id)
        for p in prompts:
            journal.append({"id": p["id"], "status": "completed", "text": "a",
                            "source": p["source"], "finish_reason": "stop"})
        return SimpleNamespace(
            counts={"completed": len(prompts), "skipped": 0, "failed": 0}, truncated=0,
            resumed=0, elapsed_s=0.0, output_tokens=1, requests=len(prompts), retries={},
            retried_failures=0, servers=[], conversations={},
            summary=lambda: f"{shard_id}: done")

    monkeypatch.setattr(shard_stage, "run_shard", run_shard)
    monkeypatch.setattr("include.target_tokenizer.load_tokenizer", lambda path: None)
    return ran


def _settings(tmp_path, **values) -> RunSettings:
    return RunSettings.from_mapping(
        {"temperature": 0.6, **values},
        deployment_settings(output_root=str(tmp_path / "out"), data_roots=[str(tmp_path)]))


def _run_store(run: RunSettings) -> LocalStore:
    store = LocalStore(run.run_uri)
    if not store.exists(shard_key(0)):
        store.write_new(shard_key(0), b"".join(encode_record(p) for p in PROMPTS))
    return store


def test_the_first_start_records_the_settings_and_a_retry_under_them_resumes(
        tmp_path, engine) -> None:
    run = _settings(tmp_path)
    store = _run_store(run)
    summary = generate_shard(run, SHARD, [], store)
    record = json.loads(store.read(journal_settings_key(SHARD)))
    assert record["fingerprint"] == run.fingerprint(COMPLETION_SETTINGS)
    assert record["settings"]["temperature"] == 0.6
    assert summary["settings_fingerprint"] == record["fingerprint"]
    generate_shard(_settings(tmp_path, in_flight_per_server=3), SHARD, [], store)
    assert engine == [SHARD, SHARD]  # a concurrency change is no other settings
    manifest = publish_shard(SHARD, store, generation=summary)
    assert manifest["generation"]["settings_fingerprint"] == record["fingerprint"]


def test_a_resume_under_a_changed_temperature_is_refused_before_any_request(
        tmp_path, engine) -> None:
    store = _run_store(_settings(tmp_path))
    generate_shard(_settings(tmp_path), SHARD, [], store)
    with pytest.raises(JournalSettingsError, match="temperature 0.6 → 1.0 .*shard-00000"):
        generate_shard(_settings(tmp_path, temperature=1.0), SHARD, [], store)
    assert engine == [SHARD]


def test_a_published_shard_is_refused_too_not_passed_off_as_this_runs(tmp_path,
                                                                     engine) -> None:
    store = _run_store(_settings(tmp_path))
    publish_shard(SHARD, store, generation=generate_shard(_settings(tmp_path), SHARD, [], store))
    with pytest.raises(JournalSettingsError, match="top_p 0.95 → 0.5"):
        generate_shard(_settings(tmp_path, top_p=0.5), SHARD, [], store)


def test_a_journal_from_before_records_gets_one_and_is_then_held_to_it(
        tmp_path, engine, caplog) -> None:
    store = _run_store(_settings(tmp_path))
    store.write_new(started_key(SHARD), b"")  # started by a release that recorded nothing
    caplog.set_level("WARNING")
    generate_shard(_settings(tmp_path), SHARD, [], store)
    assert "shard-00000" in caplog.text and "cannot be told" in caplog.text
    assert json.loads(store.read(journal_settings_key(SHARD)))["unrecorded_before"] is True
    with pytest.raises(JournalSettingsError):
        generate_shard(_settings(tmp_path, temperature=1.0), SHARD, [], store)


def test_force_regenerate_writes_afresh_and_records_why(tmp_path, engine) -> None:
    earlier = _run_store(_settings(tmp_path))
    generate_shard(_settings(tmp_path), SHARD, [], earlier)
    run = _settings(tmp_path, temperature=1.0, force_regenerate=True)
    fresh = LocalStore(outputs_uri(run, "manual__2026"))
    assert fresh.root.endswith(regeneration_prefix("manual__2026"))
    summary = generate_shard(run, SHARD, [], fresh, earlier)
    why = json.loads(fresh.read(journal_settings_key(SHARD)))["regeneration"]
    assert why["reason"] == ("force_regenerate: settings differ from the earlier journal: "
                             "temperature 0.6 → 1.0")
    assert why["earlier_journal"] == earlier.uri(f"journal/{SHARD}")
    manifest = publish_shard(SHARD, fresh, earlier, generation=summary)
    assert manifest["generation"]["regeneration"] == why  # what the report reads
    assert json.loads(earlier.read(journal_settings_key(SHARD)))["settings"][
        "temperature"] == 0.6  # the earlier journal untouched


def test_the_generate_task_refuses_for_good_naming_the_setting(tmp_path, engine,
                                                              monkeypatch) -> None:
    from include.settings.errors import TaskRefused

    store = _run_store(_settings(tmp_path))
    generate_shard(_settings(tmp_path), SHARD, [], store)
    for name, value in deployment_env({"output_root": str(tmp_path / "out"),
                                       "data_roots": [str(tmp_path)]}).items():
        monkeypatch.setenv(name, value)
    params = {"temperature": 1.0}
    with pytest.raises(TaskRefused, match="temperature 0.6 → 1.0"):
        generate_task.run(SHARD, [], _settings(tmp_path).run_uri, None, params,
                          dag_id="regenerate_drafter_data", run_id=None, ti=None, slots=1)
    assert engine == [SHARD]
