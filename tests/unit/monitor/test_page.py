"""The monitor page's HTML (``include/monitor/page.py``): Airflow's words for every
state, a run's state and failure first, live runs first (issue 27)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from include.dag_names import SHARD_TASKS
from include.monitor.page import render_page, sections
from include.monitor.runs import RunMonitor
from include.monitor.states import (
    FILE_WORDS,
    NO_STATUS,
    STATE_ORDER,
    ShardPhase,
    TaskRow,
    attach,
    summarize_run,
    ui_words,
)
from include.storage import LocalStore
from tests.unit.reporting.synthetic_run import T0, ShardSpec, write_prompts_manifest, write_shard

DAG = "regenerate_drafter_data"
GEN = SHARD_TASKS[0]


def _airflow_words() -> dict[str, str]:
    """The words Airflow's installed UI shows for each state, as the plugin reads them."""
    import airflow
    from airflow.utils.state import DagRunState, TaskInstanceState

    table = (Path(airflow.__file__).parent / "ui" / "dist" / "i18n" / "locales" / "en"
             / "common.json")
    states = json.loads(table.read_text())["states"]
    return ui_words([*(s.value for s in TaskInstanceState), *(s.value for s in DagRunState)],
                    states)


def _state(tmp_path) -> dict:
    """A page state: a live run mid-way, a run that failed its quality gates, one that failed
    in check_settings, every shard state Airflow has."""
    out = LocalStore(tmp_path)
    live = LocalStore(tmp_path / "live")
    shards = {f"shard-0000{i}": ShardSpec(completed=4) for i in range(3)}
    write_prompts_manifest(live, shards)
    write_shard(live, "shard-00000", shards["shard-00000"])
    write_shard(live, "shard-00001", ShardSpec(completed=2, journal_only=True))
    gated = LocalStore(tmp_path / "gated")
    write_prompts_manifest(gated, {"shard-00000": ShardSpec(completed=4, truncated=3)})
    write_shard(gated, "shard-00000", ShardSpec(completed=4, truncated=3))
    files = RunMonitor(out).runs(now=T0 + 5, probe=False)
    states = [s for s in STATE_ORDER]
    tasks = [TaskRow(GEN, i, None if s == NO_STATUS else s, f"shard-{i:05d}")
             for i, s in enumerate(states)]
    runs = [
        summarize_run(DAG, {"run_id": "gate_run", "state": "failed", "conf": {
            "run_name": "gated"}, "start_date": "2026-05-01T10:00:00+00:00"},
            [TaskRow(t, 0, "success", "shard-00000") for t in SHARD_TASKS], [], failure={
                "task_id": "report", "map_index": -1, "lines": [],
                "message": "run gated failed 1 quality gate(s): truncation rate 0.75 > 0.05"}),
        summarize_run(DAG, {"run_id": "live_run", "state": "running", "live": True, "conf": {
            "run_name": "live"}, "start_date": "2026-05-01T09:00:00+00:00"}, tasks, []),
        summarize_run(DAG, {"run_id": "doomed_run", "state": "failed", "conf": {
            "run_name": "doomed"}, "start_date": "2026-05-01T11:00:00+00:00"}, [], None,
            failure={"task_id": "check_settings", "map_index": -1,
                     "message": "1 setting refused: model_path",
                     "lines": ["1 setting refused:", "1. setting `model_path`: got 'x'"]}),
    ]
    page, others = attach(files, runs)
    return {"output_root": str(tmp_path), "runs": page, "other_airflow_runs": others,
            "airflow_error": None}


def test_every_state_word_on_the_page_is_airflows(tmp_path) -> None:
    words = _airflow_words()
    html = render_page(_state(tmp_path), words)
    # A badge, a shard chip and a shard group name their state: each says Airflow's word.
    badges = re.findall(r"class='badge st-([a-z_]+)'[^>]*>([^<]+)<", html)
    chips = re.findall(r"class='chip st-([a-z_]+)'.*?<span class='muted'>\w+ ([^<]+)</span>",
                       html)
    groups = re.findall(r"data-part='af-([a-z_]+)'>(?:<summary class='muted'>|<span "
                        r"class='muted'>)([^<(]+) \(", html)
    # Every state a shard can be in is listed (a removed map index is no shard).
    assert badges and chips and {g for g, _ in groups} == set(STATE_ORDER) - {"removed"}
    for state, word in [*badges, *chips, *groups]:
        assert word == words[state], (state, word)
    assert {w for _, w in badges} == {"Failed", "Running"}
    assert "No Status" in {w for _, w in groups} and "Up For Retry" in {w for _, w in groups}
    # None of the monitor's old state words is left.
    for old in (">generating<", ">complete<", ">waiting<", ">idle<", "Left (", "queued ("):
        assert old not in html


def test_a_runs_state_and_failure_are_the_first_things_its_section_shows(tmp_path) -> None:
    words = _airflow_words()
    html = render_page(_state(tmp_path), words)
    doomed = html[html.index("data-run='doomed'"):]
    doomed = doomed[:doomed.index("</section>")]
    header_end = doomed.index("</header>")
    assert ">Failed<" in doomed[:header_end]
    # Right under the header: the failed task and why, with its own error lines.
    assert doomed[header_end:].startswith("</header><div class='failure' data-key='failure'>")
    assert "check_settings</b>: <span class='msg'>1 setting refused: model_path</span>" in doomed
    assert "Shards in this Airflow run" not in doomed  # none, and it is over
    assert "1. setting `model_path`: got &#x27;x&#x27;" in doomed
    assert "no shard tasks yet" not in html
    gated = html[html.index("data-run='gated'"):]
    gated = gated[:gated.index("</section>")]
    assert ">Failed<" in gated and "truncation rate 0.75" in gated
    # Its truncated rows are counted as such, beside completed.
    assert "data-key='truncated'><span class='v'>3<" in gated


def test_live_runs_come_first_then_the_newest(tmp_path) -> None:
    state = _state(tmp_path)
    assert [s["run_name"] for s in sections(state)] == ["live", "doomed", "gated"]
    html = render_page(state, _airflow_words())
    order = [m for m in re.findall(r"<section class='run' data-run='(\w+)'", html)]
    assert order == ["live", "doomed", "gated"]


def test_a_running_generate_task_says_what_its_files_show(tmp_path) -> None:
    html = render_page(_state(tmp_path), _airflow_words())
    live = html[html.index("data-run='live'"):]
    chips = dict(re.findall(r"data-shard='(shard-\d+)' href=[^>]*>(.*?)</a>", live))
    assert "generate Running" in chips["shard-00004"]  # map index 4 is STATE_ORDER's running
    assert FILE_WORDS[ShardPhase.NO_JOURNAL] in chips["shard-00004"]


def test_a_run_that_had_nothing_to_do_says_so_under_its_header(tmp_path) -> None:
    """Issue 34, item 6: the run's note (plugins/regen_notes.py copies prepare_prompts'
    sentence there) is the first thing its section shows."""
    said = ("nothing to do: 2 of 2 shards already complete under run_name 'again'; to make a "
            "new run, trigger with a new run_name, or with force_regenerate: true")
    runs = [summarize_run(DAG, {"run_id": f"r{i}", "state": "success", "conf": {
        "run_name": "again"}, "start_date": f"2026-05-01T1{i}:00:00+00:00", "note": said},
        [], []) for i in (2, 1)]
    page, others = attach([], runs)
    html = render_page({"output_root": str(tmp_path), "runs": page,
                        "other_airflow_runs": others, "airflow_error": None}, _airflow_words())
    section = html[html.index("data-run='again'"):]
    assert section[section.index("</header>"):].startswith(
        "</header><div class='note' data-key='note'>Note: <span class='msg'>nothing to do: 2 of "
        "2 shards already complete")
    assert html.count("data-key='note'>Note: <span class='msg'>nothing to do") == 2  # each run


def test_each_report_links_its_dataset_card(tmp_path) -> None:
    """Issue 34, item 4: the card a training team acts on is one click from the run."""
    report = LocalStore(tmp_path / "gated")
    for name, data in (("report.json", b'{"passed": false}'), ("report.html", b"<p>r</p>"),
                       ("README.md", b"# card")):
        report.write_new(f"report/gate_run/{name}", data)
    html = render_page(_state(tmp_path), _airflow_words())
    gated = html[html.index("data-run='gated'"):]
    gated = gated[:gated.index("</section>")]
    assert ("<a data-key='card' href='/regen-monitor/files/gated/report/" in gated
            and "/README.md' target='_blank'>dataset card</a>" in gated), gated[-1500:]
