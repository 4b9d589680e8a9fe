"""The check_settings task (``pipeline/check_settings.py``): its checks that need a stage (a
source's files and first row, the tokenizer, the API key, the SSH host keys) find, before any work,
every mistake that can be known in advance. The checks that need only the settings are in
``tests/unit/settings/test_check_settings.py``."""

from __future__ import annotations

import json

import pytest

from include.pipeline.check_settings import check_settings
from include.servers.expectations import budget_line
from include.settings import SettingsError
from tests.fixtures.check_inputs import check_deployment as _deployment
from tests.fixtures.check_inputs import written as _written


def test_good_settings_pass_and_log_the_completion_bound(tmp_path, data, capsys,
                                                        caplog) -> None:
    caplog.set_level("INFO")
    run = check_settings({"sources": [{"name": "mine", "path": str(data / "prompts.jsonl")}],
                          "max_tokens": 8192, "context_length": 8192},
                         _deployment(tmp_path, data))
    assert run.max_tokens == 8192  # a cap at the context length is safe: accepted
    out = capsys.readouterr()  # Airflow's structlog prints; plain logging goes to caplog
    assert budget_line(run) in out.out + out.err + caplog.text
    assert "min(max_tokens=8192, 8192 - P - 16)" in budget_line(run)
    assert "(P > 7920)" in budget_line(run)
    assert _written(tmp_path) == []


@pytest.mark.parametrize(
    ("conf", "fragments"),
    [
        ({"sources": [{"name": "mine", "path": "{data}/missing.jsonl"}]},
         ["`sources[0]` (mine)", "missing.jsonl", "does not exist"]),
        ({"sources": [{"name": "mine", "path": "{data}/empty"}]},
         ["`sources[0]` (mine)", "no .parquet, .json or .jsonl files"]),
        ({"tokenizer_path": "{data}"}, ["`tokenizer_path`", "cannot load a tokenizer"]),
    ],
)
def test_unreadable_inputs_are_refused_before_any_work(tmp_path, data, conf, fragments) -> None:
    (data / "empty").mkdir()
    conf = json.loads(json.dumps(conf).replace("{data}", str(data)))
    conf.setdefault("sources", [{"name": "mine", "path": str(data / "prompts.jsonl")}])
    with pytest.raises(SettingsError) as err:
        check_settings(conf, _deployment(tmp_path, data))
    for fragment in fragments:
        assert fragment in str(err.value)
    assert _written(tmp_path) == []


def test_a_link_out_of_the_data_roots_inside_a_directory_source_is_refused(tmp_path,
                                                                           data) -> None:
    (data / "escape.jsonl").symlink_to("/etc/hostname")
    with pytest.raises(SettingsError, match="resolves .* outside the data roots"):
        check_settings({"sources": [{"name": "mine", "path": str(data)}]},
                       _deployment(tmp_path, data))


def _ssh_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, **extra: object) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(
        {"conn_type": "ssh", "host": "gpu-box.internal", "login": "u", "extra": extra}))


PINNED = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA"


def test_gpu_host_connections_must_pin_the_host_key(tmp_path, data, monkeypatch) -> None:
    hosts = [{"host": "gpu-box.internal", "ssh_conn_id": "gpu", "gpus": [0]},
             {"host": "gpu-two.internal", "ssh_conn_id": "gpu_open", "gpus": [0]},
             {"host": "gpu-three.internal", "ssh_conn_id": "gpu_missing", "gpus": [0]}]
    _ssh_connection(monkeypatch, "gpu", host_key=PINNED)
    _ssh_connection(monkeypatch, "gpu_open", host_key=PINNED, no_host_key_check=True)
    conf = {"sources": [{"name": "mine", "path": str(data / "prompts.jsonl")}]}
    with pytest.raises(SettingsError) as err:
        check_settings(conf, _deployment(tmp_path, data, gpu_hosts=hosts, api_key="k-12345"))
    text = str(err.value)
    assert "`gpu_hosts[1]` (gpu-two.internal)" in text and "`no_host_key_check`" in text
    assert "`gpu_hosts[2]` (gpu-three.internal)" in text and "`gpu_missing`" in text
    assert "gpu_hosts[0]" not in text


def test_remote_gpu_hosts_need_an_api_key(tmp_path, data, monkeypatch) -> None:
    _ssh_connection(monkeypatch, "gpu", host_key=PINNED)
    hosts = [{"host": "gpu-box.internal", "ssh_conn_id": "gpu", "gpus": [0]}]
    conf = {"sources": [{"name": "mine", "path": str(data / "prompts.jsonl")}]}
    with pytest.raises(SettingsError, match="gpu-box.internal"):
        check_settings(conf, _deployment(tmp_path, data, gpu_hosts=hosts))
    run = check_settings(conf, _deployment(tmp_path, data, gpu_hosts=hosts, api_key="k-12345"))
    assert run.api_key == "k-12345"


@pytest.mark.parametrize(
    ("rows", "kind", "fragments"),
    [
        ([{"query": "q", "answer": "a"}], "codefeedback", ["needs columns", "'resource'"]),
        ([{"colour": "red"}], "auto", ["cannot recognise its layout", "'colour'"]),
    ],
)
def test_a_source_whose_layout_does_not_fit_is_refused_from_its_first_row(
    tmp_path, data, rows, kind, fragments
) -> None:
    for name, text in {
        "rows.jsonl": "".join(json.dumps(r) + "\n" for r in rows),
        "rows.json": "  [\n " + ", ".join(json.dumps(r) for r in rows) + "]",
    }.items():
        (data / name).write_text(text)
        with pytest.raises(SettingsError) as err:
            check_settings({"sources": [{"name": "s", "kind": kind, "path": str(data / name)}]},
                           _deployment(tmp_path, data))
        for fragment in ["`sources[0]` (s)", *fragments]:
            assert fragment in str(err.value)


def test_filters_a_source_kind_cannot_apply_are_refused(tmp_path, data) -> None:
    conf = {"sources": [{"name": "s", "kind": "codefeedback", "languages": ["en"],
                         "path": str(data / "rows.jsonl")}]}
    (data / "rows.jsonl").write_text(json.dumps({"query": "q", "answer": "a",
                                                 "resource": "r"}) + "\n")
    with pytest.raises(SettingsError, match="`languages` given but kind 'codefeedback'"):
        check_settings(conf, _deployment(tmp_path, data))


def test_the_task_logs_each_refusal_on_short_lines_and_fails_with_one_short_line(
    tmp_path, data, monkeypatch, caplog
) -> None:
    # Issue 27: the reason was one line cut off at the log's right edge, above a traceback.
    from include.pipeline.check_settings import run
    from include.settings.errors import LINE_WIDTH, TaskRefused

    monkeypatch.setenv("REGEN_OUTPUT_ROOT", str(tmp_path / "out"))
    monkeypatch.setenv("REGEN_DATA_ROOTS", json.dumps([str(data)]))
    monkeypatch.setenv("REGEN_ALLOWED_MODELS", json.dumps(["/srv/models/a-long-model-name"]))
    caplog.set_level("ERROR")
    with pytest.raises(TaskRefused) as err:
        run({"model_path": "someone/else", "shard_sise": 3,
             "sources": [{"name": "mine", "path": str(data / "prompts.jsonl")}]})
    assert str(err.value) == ("2 settings refused: shard_sise, model_path "
                              "(the reasons are in this task's log)")
    assert err.value.__cause__ is None and err.value.__suppress_context__
    lines = [r.getMessage() for r in caplog.records if r.name == "include.pipeline.refusal"]
    assert lines[0] == "2 settings refused:" and all(len(x) <= LINE_WIDTH for x in lines)
    text = " ".join(" ".join(lines).split())
    assert "setting `model_path`: got 'someone/else'" in text
    assert "REGEN_ALLOWED_MODELS" in text and "did you mean `shard_size`" in text
    assert _written(tmp_path) == []
