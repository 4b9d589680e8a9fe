"""One rule for what a run may read: hub ids are `org/name`, local paths inside a data root,
dedupe sets under the deployment's dedupe roots, tokenizers like models."""

from __future__ import annotations

import pytest

from include.settings import SettingsError
from tests.fixtures.settings import run_settings


def _refused(values: dict, **deployment) -> str:
    with pytest.raises(SettingsError) as err:
        run_settings(values, **deployment)
    return str(err.value)


@pytest.mark.parametrize("hub_id", ["/etc", "/some/dir", "../up", "a/b/c", "~/data", "x"])
def test_a_hub_id_that_is_a_path_is_refused(hub_id: str) -> None:
    text = _refused({"sources": [{"name": "new", "hub_id": hub_id}]})
    assert "`sources[0].hub_id`" in text and repr(hub_id) in text and "org/name" in text


def test_a_hub_id_naming_a_local_directory_is_refused(tmp_path, monkeypatch) -> None:
    # datasets.load_dataset("org/name") reads ./org/name first when it exists.
    (tmp_path / "org" / "name").mkdir(parents=True)
    (tmp_path / "org" / "name" / "rows.json").write_text("[]")
    monkeypatch.chdir(tmp_path)
    text = _refused({"sources": [{"name": "new", "hub_id": "org/name"}]})
    assert "names a local file or directory of this worker" in text


def test_the_deployment_may_list_hub_datasets_and_pin_revisions() -> None:
    allowed = ["BAAI/Infinity-Instruct", "TIGER-Lab/WebInstructSub@abc123"]
    run = run_settings({"sources": [{"name": "w", "hub_id": "TIGER-Lab/WebInstructSub"}]},
                       allowed_hub_datasets=allowed)
    assert run.sources[0].revision == "abc123"  # the pinned revision is filled in
    text = _refused({"sources": [{"name": "o", "hub_id": "someone/else"}]},
                    allowed_hub_datasets=allowed)
    assert "allowed hub datasets" in text and "REGEN_ALLOWED_HUB_DATASETS" in text
    text = _refused({"sources": [{"name": "w", "hub_id": "TIGER-Lab/WebInstructSub",
                                  "revision": "main"}]}, allowed_hub_datasets=allowed)
    assert "pins TIGER-Lab/WebInstructSub at 'abc123'" in text


def test_s3_dedupe_sets_must_lie_under_the_dedupe_roots() -> None:
    text = _refused({"dedupe_against": ["s3://private/secret-set.jsonl"]})
    assert "`dedupe_against[0]`" in text and "dedupe roots []" in text
    text = _refused({"dedupe_against": ["s3://data/elsewhere/x.jsonl"]},
                    dedupe_roots=["s3://data/completions"])
    assert "REGEN_DEDUPE_ROOTS" in text
    run = run_settings({"dedupe_against": ["s3://data/completions/part-0.jsonl"]},
                       dedupe_roots=["s3://data/completions"])
    assert run.dedupe_against == ["s3://data/completions/part-0.jsonl"]
    # A prefix of a root's last segment is not under it.
    _refused({"dedupe_against": ["s3://data/completions-private/x.jsonl"]},
             dedupe_roots=["s3://data/completions"])


def test_tokenizers_are_allowed_like_models(tmp_path) -> None:
    text = _refused({"tokenizer_path": "someone/tokenizer"})
    assert "`tokenizer_path`" in text and "REGEN_ALLOWED_TOKENIZERS" in text
    assert run_settings({"tokenizer_path": "someone/tokenizer"},
                        allowed_tokenizers=["someone/tokenizer"]).tokenizer_path
    assert run_settings({"tokenizer_path": "Qwen/Qwen3.6-27B"}).tokenizer_path  # a model
    text = _refused({"tokenizer_path": "/etc"}, data_roots=[str(tmp_path)])
    assert "inside the deployment's data roots" in text


@pytest.mark.parametrize(("name", "value"), [
    ("shard_size", 1_000_000), ("in_flight_per_server", 100_000),
    ("max_in_flight_per_server", 100_000), ("request_timeout_s", 10**9),
    ("launch_timeout_s", 10**9), ("max_attempts", 1000), ("health_interval_s", 10**6),
    ("max_sequence_length", 10**9), ("context_length", 10**9),
])
def test_every_resource_setting_has_an_upper_bound(name: str, value: int) -> None:
    text = _refused({name: value})
    assert f"`{name}`" in text and str(value) in text
