"""The DAG runs for real under ``airflow dags test`` (SQLite, its own Airflow home)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.fixtures.ports import free_port_block
from tests.integration.conftest import dags_test

ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "regenerate_drafter_data"

pytestmark = pytest.mark.integration


def _started_tasks(out: str) -> set[str]:
    """Return the tasks the run started, from the ``dags test`` log."""
    return set(re.findall(r"\[DAG TEST\] starting task_id=([\w.]+)", out))


def test_without_sglang_on_the_host_the_gate_fails_with_the_servers_log_tail(
    airflow_env, tmp_path
) -> None:
    # Local defaults: the prepare stage works; the GPU host (this machine) has no SGLang.
    proc = dags_test(airflow_env, {"run_name": "it", "shard_size": 64},
                     deployment={"output_root": str(tmp_path), "port_base": free_port_block(8),
                                 "server_log_dir": str(tmp_path / "logs")})
    out = proc.stdout + proc.stderr
    assert "state=failed" in out
    manifest = json.loads((tmp_path / "it" / "prompts" / "manifest.json").read_text())
    assert manifest["totals"]["kept"] > 0
    assert len(manifest["shards"]) == -(-manifest["totals"]["kept"] // 64)
    assert "prepare funnel" in out
    assert "exited before /health answered 200" in out
    assert "No module named 'sglang'" in out  # the log tail, fetched from the host
    assert not (tmp_path / "it" / "generated").exists()


@pytest.mark.parametrize(
    ("conf", "deployment", "fragments"),
    [
        # Shell commands, hosts and protection are not a run's to choose.
        ({"server_launch_command": "sh -c 'echo PWNED-$(id -un) >&2'",
          "protected_prefixes": [], "sources": [{"name": "x", "path": "/etc/passwd"}]},
         {}, ["`server_launch_command` is a deployment setting", "REGEN_SERVER_LAUNCH_COMMAND",
              "`protected_prefixes` is a deployment setting", "`sources[0].path`",
              "data roots"]),
        ({"run_name": "r", "shard_range": "5-2"}, {},
         ["`shard_range`: '5-2' in '5-2' runs backwards; accepted: low-high"]),
        ({"run_name": "r"}, {"output_root": "{tmp}/completions"},
         ["`run_name` ('r')", "protected prefix", "completions"]),
    ],
    ids=["deployment-settings-in-conf", "bad-values", "protected-output"],
)
def test_a_doomed_run_fails_in_check_settings_before_any_work(
    airflow_env, tmp_path, conf, deployment, fragments
) -> None:
    deployment = {k: v.replace("{tmp}", str(tmp_path)) for k, v in deployment.items()}
    deployment.setdefault("output_root", str(tmp_path / "out"))
    deployment.setdefault("data_roots", [str(ROOT / "include" / "sample_data")])
    proc = dags_test(airflow_env, conf, raw=True,
                     deployment={**deployment, "server_log_dir": str(tmp_path / "logs"),
                                 "port_base": free_port_block(8)})
    out = proc.stdout + proc.stderr
    for fragment in fragments:
        assert fragment in out, out[-3000:]
    assert "PWNED" not in out
    assert _started_tasks(out) == {"check_settings"}
    assert "new_state=failed" in out
    assert not (tmp_path / "logs").exists()  # no server was launched
    assert not any(p.is_file() for p in tmp_path.rglob("*"))  # nothing written anywhere


def test_values_the_form_can_check_are_refused_when_triggering(airflow_env, tmp_path) -> None:
    proc = dags_test(airflow_env, {"max_tokens": 0, "run_name": "ok\n"},
                     deployment={"output_root": str(tmp_path)})
    out = proc.stdout + proc.stderr
    assert "Invalid input for param" in out and proc.returncode != 0
    assert _started_tasks(out) == set()
    assert list(tmp_path.iterdir()) == []


def _many_prompts(path: Path, n: int) -> None:
    rows = [{"query": f"Write function number {i} that returns {i}.", "answer": "ok",
             "resource": "synthetic"}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_run_maps_more_than_1024_shards_where_the_deployment_allows_it(
    airflow_env, tmp_path
) -> None:
    import sqlite3

    _many_prompts(tmp_path / "many.jsonl", 1100)
    conf = {"run_name": "wide", "shard_size": 1,
            "held_out_per_source": 0,  # every prompt a shard: exactly 1,100
            "sources": [{"name": "many", "kind": "codefeedback",
                         "path": str(tmp_path / "many.jsonl")}]}
    deployment = {"output_root": str(tmp_path / "out"), "data_roots": [str(tmp_path)]}
    # Airflow's default (1,024): refused after preparing, before any server, saying what to do.
    proc = dags_test(airflow_env, conf, deployment=deployment)
    out = proc.stdout + proc.stderr
    assert "1100 of the 1100 shards" in out and "core.max_map_length = 1024" in out
    assert "shard_range '0-1023', then '1024-1099'" in out
    assert "AIRFLOW__CORE__MAX_MAP_LENGTH to at least 1100" in out
    assert "[DAG TEST] starting task_id=launch_servers" not in out
    # The deployment raises the limit: the same prepared shards are reused, and Airflow takes
    # the 1,100-item plan the shard task group maps over (it refuses a longer one than its
    # limit when the prepare task returns it). The GPU tasks are marked successful, not run.
    env = {**airflow_env, "AIRFLOW__CORE__MAX_MAP_LENGTH": "2048"}
    proc = dags_test(env, conf, deployment=deployment, extra_args=[
        # Airflow full-matches the pattern against each task id.
        "--mark-success-pattern", r"(?!check_settings$|prepare_prompts$).*"])
    out = proc.stdout + proc.stderr
    assert "reusing 1100 shards" in out, out[-3000:]
    assert "[DAG TEST] starting task_id=launch_servers" not in out, out[-3000:]
    db = sqlite3.connect(Path(airflow_env["AIRFLOW_HOME"]) / "airflow.db")
    rows = db.execute(
        "SELECT tm.length, ti.state FROM task_map tm JOIN task_instance ti ON "
        "ti.run_id = tm.run_id AND ti.task_id = tm.task_id WHERE tm.task_id = "
        "'prepare_prompts' ORDER BY ti.start_date DESC LIMIT 1").fetchall()
    assert rows == [(1100, "success")]
