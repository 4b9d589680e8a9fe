"""Whole-DAG runs under ``airflow dags test``: stand-in servers launched over a real sshd,
outputs in a real S3 endpoint (moto) on loopback, nothing mocked in between."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from include.layout import EVAL_PROMPTS_KEY
from sglang_standin.process import shell_launch_command
from tests.fixtures.ports import free_port_block
from tests.fixtures.s3 import Bucket, moto_endpoint, s3_bucket  # noqa: F401
from tests.fixtures.sshd import SshdServer, sshd  # noqa: F401
from tests.fixtures.standins import tokenizer_dir  # noqa: F401
from tests.integration.conftest import dags_test, failure_excerpt

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "regenerate_drafter_data"
STANDIN = shell_launch_command()
GPUS = [0, 1, 2]


class Trigger(NamedTuple):
    """A run as production gets it: its trigger conf and the deployment it runs on."""

    conf: dict[str, Any]  # run settings
    deployment: dict[str, Any]  # deployment settings: the run's REGEN_* environment


@pytest.fixture
def run_conf(tokenizer_dir, sshd: SshdServer, s3_bucket: Bucket, tmp_path):  # noqa: F811
    """Return a builder of runs: servers over SSH, outputs in the test bucket.

    ``build(run, **deployment)``: ``run`` overrides run settings, the keywords deployment
    settings (``api_key`` becomes the servers' connection).
    """
    base = free_port_block(len(GPUS))

    def build(run: dict[str, Any] | None = None, **deployment: Any) -> Trigger:
        conf = {
            "run_name": "expansion_v1",
            "shard_size": 80,
            "model_path": str(tokenizer_dir),
            "served_model_name": "Qwen/Qwen3.6-27B",
            "context_length": 8192,
            "max_tokens": 2048,
            "launch_timeout_s": 60,
            "progress_interval_s": 2,
            "health_interval_s": 0.5,
            # No held-out split unless a test asks: its answers are three more tasks a run.
            "held_out_per_source": 0,
            **(run or {}),
        }
        env = {
            "output_root": f"{s3_bucket.uri}/runs",
            "s3_conn_id": s3_bucket.endpoint.conn_id,
            "gpu_hosts": [{"host": "127.0.0.1", "ssh_conn_id": sshd.conn_id, "gpus": GPUS}],
            "port_base": base,
            "server_launch_command": STANDIN,
            "server_log_dir": str(tmp_path / "server-logs"),
            "extra_server_args": ["--enable-metrics", "--standin-time-scale", "0.02",
                                  "--standin-median-output-tokens", "150",
                                  "--standin-warmup-seconds", "0.5"],
            **deployment,
        }
        return Trigger(conf, env)

    build.base = base  # type: ignore[attr-defined]
    return build


def _dags_test(env: dict[str, str], trigger: Trigger) -> subprocess.CompletedProcess:
    return dags_test(env, trigger.conf, deployment=trigger.deployment)


def _keys(bucket: Bucket, prefix: str) -> dict[str, bytes]:
    out = {}
    paginator = bucket.client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket.name, Prefix=prefix):
        for obj in page.get("Contents", []):
            out[obj["Key"]] = bucket.client.get_object(Bucket=bucket.name,
                                                       Key=obj["Key"])["Body"].read()
    return out


def _ports_closed(base: int) -> bool:
    for port in range(base, base + len(GPUS)):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return False
    return True


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0 and "state=success" in proc.stdout + proc.stderr, (
        failure_excerpt(proc)
    )


def _airflow_db_holds(env: dict[str, str], secret: str) -> list[str]:
    """Return the tables of the run's Airflow database (SQLite) whose rows hold ``secret``."""
    import sqlite3

    db = sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db")
    hits = []
    for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'"):
        for row in db.execute(f'SELECT * FROM "{table}"'):  # noqa: S608 - our own test db
            if any(secret.encode() in (v if isinstance(v, bytes) else str(v).encode())
                   for v in row if v is not None):
                hits.append(table)
                break
    return hits


# A whole run, held-out split answered: 254 s beside CI's other process on a busy machine.
@pytest.mark.timeout(600)
def test_full_run_over_ssh_into_s3_leaves_the_original_data_untouched(
    airflow_env, run_conf, s3_bucket: Bucket  # noqa: F811
) -> None:
    originals = {f"completions/part-{i}.jsonl": f'{{"original": {i}}}\n'.encode()
                 for i in range(3)}
    for key, data in originals.items():
        s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=key, Body=data)
    key = "sk-regen-" + os.urandom(8).hex()
    sampled_dir = Path(run_conf().deployment["server_log_dir"]).parent / "sampled"
    trigger = run_conf(  # the key: a deployment's connection, never the run's conf
        {"enable_thinking": True, "held_out_per_source": 50}, api_key=key,
        # Some words sampled as a non-canonical split of the same text (a model may): the rows
        # must still be those ids, which a re-tokenization of the text would not give.
        extra_server_args=[*run_conf().deployment["extra_server_args"],
                           "--standin-noncanonical-rate", "0.01",
                           "--standin-sampled-log-dir", str(sampled_dir)],
    )
    proc = _dags_test(airflow_env, trigger)
    _ok(proc)
    assert _keys(s3_bucket, "completions/") == originals
    # The servers' key is nowhere a person or another run could read it: not in the task
    # logs, not in any output (report included), not in the run's conf, XCom or any other
    # table of Airflow's database.
    out = proc.stdout + proc.stderr
    assert key not in out
    assert "Task failed" not in out  # no task failed and was retried on the way
    # A person reads these logs: a successful run has no ERROR line (e.g. the PyTorch advisory).
    errors = [line for line in out.splitlines() if re.search(r"\bERROR\b|\[error\s*\]", line)]
    assert not errors, errors[:10]
    assert not [k for k, v in _keys(s3_bucket, "").items() if key.encode() in v]
    assert _airflow_db_holds(airflow_env, key) == []
    # The grid names each mapped task: shard tasks by shard (the held-out split's "held-out"),
    # health gates by host:port.
    import sqlite3

    db = sqlite3.connect(Path(airflow_env["AIRFLOW_HOME"]) / "airflow.db")
    (run_id,) = db.execute("SELECT run_id FROM dag_run ORDER BY id DESC LIMIT 1").fetchone()
    names = {}
    for task_id, name in db.execute("SELECT task_id, rendered_map_index FROM task_instance "
                                    "WHERE run_id = ? AND map_index >= 0", (run_id,)):
        names.setdefault(task_id, set()).add(name)
    shard_names = {s["shard_id"] for s in json.loads(
        _keys(s3_bucket, "runs/expansion_v1/prompts/manifest.json")[
            "runs/expansion_v1/prompts/manifest.json"])["shards"]}
    for task_id in ("shard.generate", "shard.upload", "shard.tokenize"):
        assert names[task_id] == shard_names | {"held-out"}, (task_id, names[task_id])
    assert names["wait_for_server"] == {f"127.0.0.1:{run_conf.base + g}" for g in GPUS}

    run = _keys(s3_bucket, "runs/expansion_v1/")
    prompts = json.loads(run["runs/expansion_v1/prompts/manifest.json"])
    n_shards = len(prompts["shards"])
    assert n_shards >= 3
    total = completed = 0
    for shard in prompts["shards"]:
        gen = json.loads(run[f"runs/expansion_v1/generated/{shard['shard_id']}.manifest.json"])
        assert sum(gen["counts"].values()) == shard["count"]  # every prompt accounted for
        lines = run[f"runs/expansion_v1/generated/{shard['shard_id']}.jsonl"].splitlines()
        ids = [json.loads(line)["id"] for line in lines]
        assert len(ids) == len(set(ids)) == gen["counts"]["completed"]
        tok = json.loads(run[f"runs/expansion_v1/tokenized/{shard['shard_id']}.manifest.json"])
        assert tok["counts"]["input"] == gen["counts"]["completed"]
        assert sum(tok["counts"]["quarantined"].values()) == 0
        total += shard["count"]
        completed += gen["counts"]["completed"]
    assert completed == total == prompts["totals"]["kept"]
    assert _ports_closed(run_conf.base)
    out = proc.stdout + proc.stderr
    assert "preflight prompt" in out and "healthy and serving the run's model" in out
    from transformers import AutoTokenizer

    think_close = AutoTokenizer.from_pretrained(trigger.conf["model_path"]).convert_tokens_to_ids(
        "</think>")
    _rows_are_the_sampled_ids(run, prompts, sampled_dir, think_close)
    _the_card_loads_the_dataset(run, prompts)
    _no_export_holds_a_held_out_prompt(run, prompts)


def _no_export_holds_a_held_out_prompt(run: dict[str, bytes], prompts: dict) -> None:
    """The run kept a held-out split (the default), and no training export holds one of its
    prompts: not a shard, a completion, a parquet row, a trainer export or a conversation.
    The target answered it too, into eval/ only, as rows made as the training rows are."""
    import io

    import pyarrow.parquet as pq

    held = [json.loads(line) for line in run[f"runs/expansion_v1/{EVAL_PROMPTS_KEY}"].splitlines()]
    assert len(held) == prompts["held_out"]["count"] >= 5
    held_ids = {r["id"] for r in held}
    exported: set[str] = set()
    for key, data in run.items():
        rel = key.removeprefix("runs/expansion_v1/")
        if rel.startswith("eval/"):
            continue
        if rel.endswith(".parquet"):
            exported |= set(pq.read_table(io.BytesIO(data)).column("id").to_pylist())
        elif rel.endswith(".jsonl") and not rel.startswith("journal/"):
            exported |= {json.loads(line).get("id") for line in data.splitlines() if line}
    assert exported and not held_ids & exported
    answers = pq.read_table(io.BytesIO(run["runs/expansion_v1/eval/tokenized/shard-00000.parquet"]))
    answered = answers.column("id").to_pylist()
    assert answered and set(answered) <= held_ids  # the split's own prompts, answered
    exported_rows = [json.loads(line) for line in
                     run["runs/expansion_v1/eval/pretokenized/shard-00000.jsonl"].splitlines()]
    assert [r["input_ids"] for r in exported_rows] == answers.column("input_ids").to_pylist()
    card = run["runs/expansion_v1/README.md"].decode()
    assert f"Held-out split: {len(held)} prompts" in card
    assert f"the target's answers, {len(answered)} rows from {len(held)} prompts" in card


def _the_card_loads_the_dataset(run: dict[str, bytes], prompts: dict) -> None:
    """The run's dataset card parses, and `datasets` loads the data it points at."""
    import tempfile

    import datasets
    import yaml

    card = run["runs/expansion_v1/README.md"].decode()
    header = yaml.safe_load(card.split("---")[1])
    pattern = header["configs"][0]["data_files"][0]["path"]
    with tempfile.TemporaryDirectory() as tmp:
        for key, data in run.items():
            rel = key.removeprefix("runs/expansion_v1/")
            if rel.startswith("tokenized/") or rel == "README.md":
                Path(tmp, rel).parent.mkdir(parents=True, exist_ok=True)
                Path(tmp, rel).write_bytes(data)
        ds = datasets.load_dataset("parquet", data_files=str(Path(tmp, pattern)), split="train")
        assert ds.num_rows == sum(s["count"] for s in prompts["shards"])
        assert header["dataset_info"]["splits"][0]["num_examples"] == ds.num_rows
        assert {"input_ids", "loss_mask", "sampling_temperature", "server_version"} <= set(
            ds.column_names)
        assert set(ds["server_version"]) == {"0.5.23"}


def _rows_are_the_sampled_ids(run: dict[str, bytes], prompts: dict, sampled_dir: Path,
                              think_close: int) -> None:
    """Every parquet row is the stand-in's prompt ids + the ids it sampled (its own log)."""
    import io
    from itertools import compress

    import pyarrow.parquet as pq

    from sglang_standin.testing import read_sampled_log

    sampled = read_sampled_log(sampled_dir)
    rows = differs = thinking = 0
    for shard in prompts["shards"]:
        tok = json.loads(run[f"runs/expansion_v1/tokenized/{shard['shard_id']}.manifest.json"])
        differs += tok["counts"]["retokenized_text_differs"]
        assert tok["counts"]["token_source"]["text"] == 0
        table = pq.read_table(io.BytesIO(run[f"runs/expansion_v1/tokenized/"
                                             f"{shard['shard_id']}.parquet"]))
        for ids, mask in zip(table["input_ids"].to_pylist(), table["loss_mask"].to_pylist(),
                             strict=True):
            prompt = tuple(ids[: mask.index(1)])
            masked = list(compress(ids, mask))
            assert masked in sampled[prompt]  # exactly what the stand-in sampled for it
            assert len(prompt) + len(masked) == len(ids)  # one masked span, to the end
            thinking += think_close in masked
            rows += 1
    assert rows == sum(s["count"] for s in prompts["shards"])
    assert thinking > rows * 0.9  # thinking mode: the think block is in the trained ids
    assert differs > 0  # a rebuild from the text would have trained on other ids


# Four `airflow dags test` runs one after the other: 235-300 s on 2 cores; run alone, the
# session's fixtures (Airflow's database, sshd, S3) are set up inside its time too.
@pytest.mark.timeout(600)
def test_shard_range_backfill_produces_only_those_shards_then_reuses_prompts(
    airflow_env, run_conf, s3_bucket: Bucket  # noqa: F811
) -> None:
    _ok(_dags_test(airflow_env, run_conf({"shard_range": "1-2"})))
    run = _keys(s3_bucket, "runs/expansion_v1/")
    generated = sorted(k for k in run if k.startswith("runs/expansion_v1/tokenized/")
                       and k.endswith(".manifest.json"))
    assert generated == [f"runs/expansion_v1/tokenized/shard-0000{i}.manifest.json"
                         for i in (1, 2)]
    before = {k: v for k, v in run.items() if "/generated/" in k}

    proc = _dags_test(airflow_env, run_conf({"shard_range": "0-3"}))
    _ok(proc)
    out = proc.stdout + proc.stderr
    assert "reusing" in out and "2 already complete and skipped" in out
    after = _keys(s3_bucket, "runs/expansion_v1/")
    assert {k: after[k] for k in before} == before  # completed shards were not redone
    assert "runs/expansion_v1/tokenized/shard-00000.manifest.json" in after
    assert "runs/expansion_v1/tokenized/shard-00003.manifest.json" in after

    proc = _dags_test(airflow_env, run_conf({"shard_range": "1", "force_regenerate": True}))
    _ok(proc)
    again = _keys(s3_bucket, "runs/expansion_v1/")
    assert {k: again[k] for k in before} == before  # never over the old outputs
    regenerated = [k for k in again if "/regenerations/" in k and k.endswith(
        "tokenized/shard-00001.manifest.json")]
    assert len(regenerated) == 1

    # A backfill with nothing left to do needs no GPU: no server is launched.
    log_dir = Path(run_conf().deployment["server_log_dir"])
    logs_before = sorted(p.name for p in log_dir.glob("*")) if log_dir.exists() else []
    proc = _dags_test(airflow_env, run_conf({"shard_range": "0-3"}))
    _ok(proc)
    out = proc.stdout + proc.stderr
    assert "4 already complete and skipped" in out
    assert "no server launched" in out
    assert "[DAG TEST] starting task_id=wait_for_server" not in out
    assert (sorted(p.name for p in log_dir.glob("*")) if log_dir.exists() else []) == logs_before


def test_a_server_killed_mid_run_loses_nothing(
    airflow_env, run_conf, s3_bucket: Bucket, tmp_path  # noqa: F811
) -> None:
    trigger = run_conf({"shard_range": "0-1"},
                       extra_server_args=["--enable-metrics", "--standin-time-scale", "0.2",
                                          "--standin-median-output-tokens", "150",
                                          "--standin-warmup-seconds", "0.5"])
    pid_file = Path(trigger.deployment["server_log_dir"]) / f"server-{run_conf.base + 1}.pid"
    killed: list[int] = []

    def kill_when_busy() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            journal = [k for k in _keys(s3_bucket, "runs/expansion_v1/journal/")]
            if journal and pid_file.exists():
                pid = int(pid_file.read_text().split()[0])
                os.killpg(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_when_busy, daemon=True)
    killer.start()
    proc = _dags_test(airflow_env, trigger)
    killer.join(5)
    _ok(proc)
    assert killed, "the test never found a server to kill mid-run"
    run = _keys(s3_bucket, "runs/expansion_v1/")
    prompts = json.loads(run["runs/expansion_v1/prompts/manifest.json"])
    for shard in prompts["shards"][:2]:
        gen = json.loads(run[f"runs/expansion_v1/generated/{shard['shard_id']}.manifest.json"])
        assert gen["counts"] == {"completed": shard["count"], "skipped": 0, "failed": 0}
    # The dead server left rotation: ejected mid-shard, or found dead when the next shard
    # started (whichever the kill landed in).
    out = proc.stdout + proc.stderr
    assert "ejected" in out or "unreachable at start" in out


def test_a_failed_run_still_stops_the_servers_it_started(
    airflow_env, run_conf, tmp_path
) -> None:
    # Every answer is cut at 16 tokens and no truncation is tolerated: the servers run, the
    # shards finish, and the report's quality gate fails the run.
    trigger = run_conf({"shard_range": "0", "max_tokens": 16, "max_truncation_rate": 0.0})
    proc = _dags_test(airflow_env, trigger)
    out = proc.stdout + proc.stderr
    assert "state=failed" in out
    assert "max_truncation_rate" in out  # the error names the gate's setting
    assert "task_id=stop_servers" in out
    assert _ports_closed(run_conf.base)
