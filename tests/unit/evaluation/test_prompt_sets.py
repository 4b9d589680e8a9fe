"""Named prompt sets (issue 36, item 2): read as MT-Bench, GSM8K and HumanEval distribute them,
resolved only through the deployment's list, refused with the set, file, line and what is
accepted; every problem at once."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from include.evaluation.checks import request_problems
from include.evaluation.compat import read_config
from include.evaluation.prompt_sets import (
    ACCEPTED,
    PromptSetError,
    load_prompt_sets,
    named_sets,
    read_prompt_set,
)
from include.evaluation.settings import EvaluationRequest
from include.storage.store import LocalStore
from tests.unit.evaluation.helpers import prompt, write_split

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "prompt_sets"


def _copy(root: Path, name: str) -> str:
    root.mkdir(parents=True, exist_ok=True)
    return str(Path(shutil.copy(FIXTURES / name, root / name)))


def test_mt_bench_question_jsonl_sends_each_question_s_first_turn(tmp_path: Path) -> None:
    s = read_prompt_set("mt_bench", _copy(tmp_path, "mt_bench_question.jsonl"))
    assert [p["id"] for p in s.prompts] == ["set:mt_bench/1", "set:mt_bench/2", "set:mt_bench/3"]
    first = s.prompts[1]
    assert first["messages"] == [{"role": "user", "content":
                                  "A shop sells pens at 3 for 2 dollars. How much do 12 pens "
                                  "cost?"}]
    assert first["source"] == "set:mt_bench" and first["prompt_set"] == "mt_bench"
    assert first["metadata"] == {"prompt_set": "mt_bench", "line": 2, "category": "math"}


def test_gsm8k_sends_the_question_never_the_answer(tmp_path: Path) -> None:
    s = read_prompt_set("gsm8k", _copy(tmp_path, "gsm8k_test.jsonl"))
    assert [p["id"] for p in s.prompts] == [f"set:gsm8k/line-{i}" for i in (1, 2, 3)]
    assert all("####" not in p["messages"][0]["content"] for p in s.prompts)
    assert s.prompts[0]["messages"][0]["content"].startswith("Mia has 4 boxes")


def test_humaneval_jsonl_gz_sends_the_stub_verbatim(tmp_path: Path) -> None:
    raw = (FIXTURES / "humaneval.jsonl").read_bytes()
    path = tmp_path / "HumanEval.jsonl.gz"
    path.write_bytes(gzip.compress(raw))
    s = read_prompt_set("humaneval", str(path))
    assert [p["id"] for p in s.prompts] == ["set:humaneval/HumanEval/0",
                                            "set:humaneval/HumanEval/1"]
    assert s.prompts[0]["messages"][0]["content"] == json.loads(raw.splitlines()[0])["prompt"]


def test_the_hub_copies_in_parquet_are_read_too(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # HuggingFaceH4/mt_bench_prompts renames turns to prompt (a list) and adds prompt_id.
    path = tmp_path / "mt_bench_prompts.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"prompt": ["First question?", "Second?"], "prompt_id": 17, "category": "stem"},
        {"prompt": ["Another one?", "More?"], "prompt_id": 18, "category": "stem"}]), path)
    s = read_prompt_set("mtb", str(path))
    assert [(p["id"], p["messages"][0]["content"]) for p in s.prompts] == [
        ("set:mtb/17", "First question?"), ("set:mtb/18", "Another one?")]


def test_a_malformed_file_names_the_set_file_lines_and_what_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "fine?"}\n'
                    "{not json\n"
                    "\n"
                    '{"text": "no prompt field"}\n'
                    '{"turns": []}\n'
                    '[1, 2]\n')
    with pytest.raises(PromptSetError) as err:
        read_prompt_set("mine", str(path))
    text = str(err.value)
    assert text.startswith(f"prompt set 'mine' ({path}) is malformed: line 2: not JSON")
    assert "line 4: no prompt text (it has ['text'])" in text
    assert "line 5: no prompt text (it has ['turns'])" in text
    assert "line 6: no prompt text (it has list)" in text
    assert "line 1" not in text and "line 3" not in text
    assert text.endswith(f"Accepted: {ACCEPTED}")


def test_a_repeated_id_an_empty_file_and_too_many_bad_lines_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "twice.jsonl"
    path.write_text('{"task_id": "a", "prompt": "x"}\n{"task_id": "a", "prompt": "y"}\n')
    with pytest.raises(PromptSetError, match=r"line 2: id 'set:twice/a' again \(first at "
                                             r"line 1\)"):
        read_prompt_set("twice", str(path))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(PromptSetError, match="holds no prompt"):
        read_prompt_set("empty", str(tmp_path / "empty.jsonl"))
    (tmp_path / "many.jsonl").write_text('{"x": 1}\n' * 9)
    with pytest.raises(PromptSetError, match="; and 4 more lines. Accepted"):
        read_prompt_set("many", str(tmp_path / "many.jsonl"))


def test_unknown_outside_missing_unreadable_and_corrupt_sets_are_all_named(
        tmp_path: Path) -> None:
    data, outside = tmp_path / "data", tmp_path / "elsewhere"
    allowed = {
        "mt_bench": _copy(data, "mt_bench_question.jsonl"),
        "outside": _copy(outside, "gsm8k_test.jsonl"),
        "missing": str(data / "gone.jsonl"),
        "csv": str(data / "x.csv"),
        "locked": _copy(data / "locked", "gsm8k_test.jsonl"),
        "corrupt": str(data / "corrupt.jsonl.gz"),
        # A link inside the root to a file outside it is outside: links are resolved.
        "link": str(data / "link.jsonl"),
    }
    (data / "x.csv").write_text("question\nwhy?\n")
    (data / "corrupt.jsonl.gz").write_bytes(b"not gzip at all")
    os.symlink(allowed["outside"], data / "link.jsonl")
    os.chmod(allowed["locked"], 0)
    names = ["mt_bench", "nope", "outside", "missing", "csv", "locked", "corrupt", "link"]
    try:
        sets, problems = load_prompt_sets(names, allowed, [str(data)])
    finally:
        os.chmod(allowed["locked"], 0o644)
    root = os.geteuid() == 0  # root reads a file whatever its mode
    assert [s.name for s in sets] == ["mt_bench", *(["locked"] if root else [])]
    assert problems[0] == ("prompt set 'nope' is not one the deployment lists "
                           "(REGEN_ALLOWED_PROMPT_SETS: " + str(sorted(allowed)) + ")")
    assert problems[1].startswith(f"prompt set 'outside': its file {allowed['outside']} is "
                                  "outside the data roots")
    assert "(REGEN_DATA_ROOTS): refused" in problems[1]
    assert "'missing': its file" in problems[2] and "does not exist" in problems[2]
    assert "'csv'" in problems[3] and "reads .jsonl, .jsonl.gz, .parquet" in problems[3]
    assert "'link'" in problems[4] and "outside the data roots" in problems[4]
    rest = problems[5:]
    if not root:
        assert rest[0].startswith(f"prompt set 'locked' ({allowed['locked']}) cannot be read")
        rest = rest[1:]
    assert rest[0].startswith(f"prompt set 'corrupt' ({allowed['corrupt']}) cannot be read")
    with pytest.raises(PromptSetError, match="'nope' is not one"):
        named_sets(["nope"], allowed, [str(data)])


def test_the_request_names_sets_and_the_check_reports_them_beside_other_problems(
        tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="prompt set name '../etc/passwd'"):
        EvaluationRequest(baseline="base", candidates=["cand"], prompt_sets=["../etc/passwd"])
    request = EvaluationRequest(dataset_run="demo", baseline="base", candidates=["cand"],
                                prompt_sets=["mt_bench", "gsm8k"])
    allowed = {"mt_bench": _copy(tmp_path / "data", "mt_bench_question.jsonl")}
    problems = request_problems(request, {}, LocalStore(tmp_path / "run"), None, read_config,
                                allowed_sets=allowed, data_roots=[str(tmp_path / "data")])
    assert len(problems) == 4  # two drafters, no split, one unknown set: all at once
    assert "has no held-out split" in problems[2]
    assert problems[3].startswith("prompt set 'gsm8k' is not one the deployment lists")
    write_split(tmp_path / "run", [prompt(0, "math")])
    assert request_problems(request.model_copy(update={"prompt_sets": ["mt_bench"]}), {},
                            LocalStore(tmp_path / "run"), None, read_config,
                            allowed_sets=allowed, data_roots=[str(tmp_path / "data")]) == [
        "drafter 'base' is not one the deployment allows (REGEN_ALLOWED_DRAFTERS: [])",
        "drafter 'cand' is not one the deployment allows (REGEN_ALLOWED_DRAFTERS: [])"]


def test_the_deployment_setting_is_read_from_its_environment_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from include.settings.deployment import DeploymentSettings

    monkeypatch.setenv("REGEN_ALLOWED_PROMPT_SETS", '{"mt_bench": "/data/question.jsonl"}')
    assert DeploymentSettings().allowed_prompt_sets == {"mt_bench": "/data/question.jsonl"}
    monkeypatch.delenv("REGEN_ALLOWED_PROMPT_SETS")
    assert DeploymentSettings().allowed_prompt_sets == {}
