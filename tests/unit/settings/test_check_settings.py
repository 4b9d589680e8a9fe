"""``check_settings`` runs the checks that need only the settings (``settings/validation.py``): the
output location, ``dedupe_against``, the shards an earlier run prepared. Its checks that need a
stage are in ``tests/unit/pipeline/test_check_settings.py``."""

from __future__ import annotations

import json

import pytest

from include.pipeline.check_settings import check_settings
from include.settings import SettingsError
from tests.fixtures.check_inputs import check_deployment as _deployment
from tests.fixtures.check_inputs import written as _written


@pytest.mark.parametrize(
    ("conf", "fragments"),
    [
        ({"dedupe_against": ["{data}/nope.jsonl"]},
         ["`dedupe_against[0]`", "nope.jsonl", "does not exist"]),
        ({"dedupe_against": ["{data}/empty"]},
         ["`dedupe_against[0]`", "holds no .jsonl/.json files"]),
    ],
)
def test_unreadable_dedupe_locations_are_refused_before_any_work(tmp_path, data, conf,
                                                                 fragments) -> None:
    (data / "empty").mkdir()
    conf = json.loads(json.dumps(conf).replace("{data}", str(data)))
    conf.setdefault("sources", [{"name": "mine", "path": str(data / "prompts.jsonl")}])
    with pytest.raises(SettingsError) as err:
        check_settings(conf, _deployment(tmp_path, data))
    for fragment in fragments:
        assert fragment in str(err.value)
    assert _written(tmp_path) == []


def test_an_output_location_under_a_protected_prefix_is_refused(tmp_path, data) -> None:
    dep = _deployment(tmp_path, data, output_root=str(tmp_path / "completions"))
    with pytest.raises(SettingsError) as err:
        check_settings({"sources": [{"name": "mine", "path": str(data / "prompts.jsonl")}]},
                       dep)
    assert "`run_name`" in str(err.value) and "completions" in str(err.value)
    assert not (tmp_path / "completions").exists()


def test_shard_range_and_preparation_settings_are_checked_against_earlier_shards(
    tmp_path, data
) -> None:
    dep = _deployment(tmp_path, data)
    conf = {"sources": [{"name": "mine", "path": str(data / "prompts.jsonl")}],
            "run_name": "r1"}
    run = check_settings(conf, dep)
    manifest = tmp_path / "out" / "r1" / "prompts" / "manifest.json"
    manifest.parent.mkdir(parents=True)
    from include.settings import PREPARATION_SETTINGS

    manifest.write_text(json.dumps({
        "preparation_fingerprint": run.fingerprint(PREPARATION_SETTINGS),
        "preparation_settings": run.subset(PREPARATION_SETTINGS),
        "shards": [{"count": 5}] * 4}))
    check_settings({**conf, "shard_range": "0-3"}, dep)
    with pytest.raises(SettingsError, match=r"`shard_range`: '2-9' is outside the 4 shards"):
        check_settings({**conf, "shard_range": "0,2-9"}, dep)
    with pytest.raises(SettingsError, match=r"other preparation settings \(different: "
                                            r"\['shard_size'\]\)"):
        check_settings({**conf, "shard_size": 7}, dep)


def test_every_refused_setting_is_reported_at_once(tmp_path, data) -> None:
    """Issue 34, item 1: a model the deployment does not allow did hide a protected run_name
    until the next try; now both are named in one refusal, and nothing is written."""
    dep = _deployment(tmp_path, data, protected_prefixes=[str(tmp_path / "out" / "completions")])
    with pytest.raises(SettingsError) as err:
        check_settings({"sources": [{"name": "mine", "path": str(data / "prompts.jsonl")}],
                        "model_path": "org/not-allowed", "run_name": "completions"}, dep)
    assert len(err.value.problems) == 2, err.value.problems
    assert "`model_path`" in err.value.problems[0]
    assert "`run_name`" in err.value.problems[1] and "completions" in err.value.problems[1]
    assert _written(tmp_path) == []


def test_a_refused_location_is_not_opened_by_the_other_checks(tmp_path, data) -> None:
    """The deployment refuses a dedupe location outside the data roots: it is named once, by
    the deployment's rule, and never read (its file is not even looked at)."""
    outside = tmp_path / "elsewhere.jsonl"
    with pytest.raises(SettingsError) as err:
        check_settings({"sources": [{"name": "mine", "path": str(data / "prompts.jsonl")}],
                        "model_path": "org/not-allowed", "dedupe_against": [str(outside)]},
                       _deployment(tmp_path, data))
    problems = err.value.problems
    assert [p for p in problems if "dedupe_against[0]" in p] == [
        p for p in problems if "inside the data roots" in p], problems
    assert not any("does not exist" in p for p in problems), problems
