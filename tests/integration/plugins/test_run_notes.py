"""plugins/regen_notes.py in a real Airflow: a run that had nothing to do says so in its note.

Issue 34, item 6: re-triggered with every shard complete, a run skipped everything after
``launch_servers`` and ended green with no word of why. ``prepare_prompts`` leaves the
sentence in XCom; the plugin's listener writes it into the run's note when the run succeeds.
The scheduler hands the listener the run in its own session (seen on ``./dev up``, screenshot
in the issue's note); ``airflow dags test`` hands it a run no session holds, which failed the
listener once ("Error while calling listener"): both are held here, in the second way.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.integration

#: The real DAG's id and its prepare_prompts task, with nothing else: the listener reads
#: only the run's id and that task's XCom.
DAG = '''
import pendulum
from airflow.sdk import dag, get_current_context, task

@dag(dag_id="regenerate_drafter_data", schedule=None,
     start_date=pendulum.datetime(2026, 1, 1, tz="UTC"))
def d():
    @task
    def prepare_prompts(params=None):
        said = (params or {}).get("say")
        if said:
            get_current_context()["ti"].xcom_push("nothing_to_do", said)
        return []
    prepare_prompts()
d()
'''


def test_a_run_with_nothing_to_do_gets_its_note_and_a_run_with_work_does_not(tmp_path) -> None:
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "d.py").write_text(DAG)
    env = dict(os.environ, AIRFLOW_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT),
               AIRFLOW__CORE__DAGS_FOLDER=str(tmp_path / "dags"),
               AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"),
               AIRFLOW__CORE__LOAD_EXAMPLES="False")
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True)
    said = "nothing to do: 3 of 3 shards already complete under run_name 'r'"
    outputs = []
    for conf in ('{"say": "' + said + '"}', "{}"):
        done = subprocess.run([airflow, "dags", "test", "regenerate_drafter_data", "-c", conf],
                              env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        outputs.append(done.stdout + done.stderr)
    for out in outputs:
        assert "Error while calling listener" not in out and "could not write" not in out, out
    with sqlite3.connect(tmp_path / "home" / "airflow.db") as db:
        notes = db.execute("SELECT r.conf, n.content FROM dag_run r LEFT JOIN dag_run_note n "
                           "ON n.dag_run_id = r.id ORDER BY r.id").fetchall()
    assert [content for _, content in notes] == [said, None]
