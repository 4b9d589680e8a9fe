"""Run the whole DAG end to end on this machine, on the bundled sample files.

Called by ``./dev demo``. Everything is real except the GPU servers:

* Airflow on SQLite (``.airflow/``), the DAG run by ``airflow dags test``;
* a local S3-compatible endpoint (moto's server mode) holding the outputs, with a pretend
  original dataset under ``completions/`` that the run must leave untouched;
* eight stand-in SGLang servers (``sglang_standin``, a test double of SGLang's HTTP API),
  launched by the DAG's own launcher, locally or over SSH (``--ssh-conn-id``);
* the bundled samples of the six source datasets in their published schemas.

At the end it copies the run's objects to ``var/demo/<run_name>/`` for inspection, prints
the funnel and the per-shard results, and how to open the Airflow UI on the same database.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from sglang_standin.process import free_port

ROOT = Path(__file__).resolve().parent.parent
DAG_ID = "regenerate_drafter_data"
BUCKET = "demo"
S3_CONN_ID = "demo_s3"


def start_s3() -> tuple[subprocess.Popen[bytes], str]:
    """Start moto's S3 server on a free loopback port; return it and its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        try:
            urllib.request.urlopen(url, timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the local S3 endpoint did not start on {url}")


def main() -> int:
    """Run the demo; return the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-name", default=time.strftime("demo-%Y%m%d-%H%M%S").lower())
    parser.add_argument("--gpus", type=int, default=8, help="stand-in servers to launch")
    parser.add_argument("--ssh-conn-id", default=None,
                        help="launch the stand-ins through this Airflow SSH connection")
    args = parser.parse_args()

    import boto3

    from sglang_standin.process import shell_launch_command
    from sglang_standin.tokenizer import build_chat_tokenizer

    work = ROOT / "var" / "demo"
    work.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work / "sampled", ignore_errors=True)  # this run's answers only
    tokenizer = build_chat_tokenizer(work / "tokenizer", context_length=8192)
    s3, url = start_s3()
    env = dict(os.environ)
    env[f"AIRFLOW_CONN_{S3_CONN_ID.upper()}"] = json.dumps({
        "conn_type": "aws", "login": "demo", "password": "demo",
        "extra": {"endpoint_url": url, "region_name": "us-east-1"},
    })
    client = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id="demo", aws_secret_access_key="demo")
    client.create_bucket(Bucket=BUCKET)
    original = b'{"id": "original-0", "conversations": []}\n'
    client.put_object(Bucket=BUCKET, Key="completions/original.jsonl", Body=original)

    # What whoever deploys sets (REGEN_* environment variables, as in docker-compose.yaml)...
    deployment = {
        "output_root": f"s3://{BUCKET}/runs",
        "s3_conn_id": S3_CONN_ID,
        "allowed_models": [str(tokenizer)],
        "data_roots": [str(ROOT / "include" / "sample_data"), str(tokenizer)],
        "gpu_hosts": [{"host": "127.0.0.1", "ssh_conn_id": args.ssh_conn_id,
                       "gpus": list(range(args.gpus))}],
        "port_base": 30000,
        "server_launch_command": shell_launch_command(),
        "server_log_dir": str(work / "server-logs"),
        "extra_server_args": ["--enable-metrics", "--enable-cache-report",
                              "--standin-time-scale", "0.02",
                              "--standin-median-output-tokens", "200",
                              "--standin-load-seconds", "1", "--standin-warmup-seconds", "2",
                              # A model may sample a non-canonical split of a word (same
                              # text, other ids): modelled at 0.2% of words, so the summary
                              # shows what re-tokenizing the text would have changed.
                              "--standin-noncanonical-rate", "0.002",
                              "--standin-sampled-log-dir", str(work / "sampled")],
    }
    for name, value in deployment.items():
        env[f"REGEN_{name.upper()}"] = value if isinstance(value, str) else json.dumps(value)
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # `airflow dags test` runs one task at a time: a staggered start (shards in flight waiting
    # on each other's progress) would only add waits, and show as idle servers in the plot.
    env["REGEN_MAX_ACTIVE_SHARDS"] = "1"
    # ... and what a person who triggers a run chooses (the trigger form's fields).
    conf = {
        "run_name": args.run_name,
        "enable_thinking": True,
        "shard_size": 50,
        "model_path": str(tokenizer),
        "served_model_name": "Qwen/Qwen3.6-27B",
        "context_length": 8192,
        "max_tokens": 4096,
        "progress_interval_s": 2,
        "health_interval_s": 1,
    }
    try:
        print(f"==> airflow db migrate (AIRFLOW_HOME={env.get('AIRFLOW_HOME')})", flush=True)
        subprocess.run(["airflow", "db", "migrate"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        print(f"==> airflow dags test {DAG_ID} -c '<conf>' (logs: {work / 'dag-test.log'})",
              flush=True)
        with open(work / "dag-test.log", "w") as log:
            proc = subprocess.run(["airflow", "dags", "test", DAG_ID, "-c", json.dumps(conf)],
                                  env=env, stdout=log, stderr=subprocess.STDOUT)
        mirror = work / args.run_name
        _mirror(client, f"runs/{args.run_name}/", mirror)
        untouched = client.get_object(Bucket=BUCKET,
                                      Key="completions/original.jsonl")["Body"].read()
        _summary(mirror, proc.returncode, untouched == original, work)
        return proc.returncode
    finally:
        s3.terminate()
        s3.wait(10)


def _mirror(client, prefix: str, target: Path) -> None:
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=BUCKET, Prefix=prefix):
        for obj in page.get("Contents", []):
            path = target / obj["Key"][len(prefix):]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read())


def _summary(mirror: Path, returncode: int, untouched: bool, work: Path) -> None:
    from include.prompts import format_funnel

    print()
    print(f"DAG run:          {'succeeded' if returncode == 0 else 'FAILED'} "
          f"(log: {work / 'dag-test.log'})")
    print(f"outputs:          s3://{BUCKET}/runs/{mirror.name}/ (copied to {mirror})")
    print(f"original data:    s3://{BUCKET}/completions/ {'untouched' if untouched else 'CHANGED'}")
    manifest = mirror / "prompts" / "manifest.json"
    if manifest.exists():
        print(format_funnel(json.loads(manifest.read_text())))
    for gen in sorted((mirror / "generated").glob("*.manifest.json")):
        g = json.loads(gen.read_text())
        tok_path = mirror / "tokenized" / gen.name
        tok = json.loads(tok_path.read_text()) if tok_path.exists() else None
        tokens = f"{tok['tokens']['total']} tokens ({tok['tokens']['loss']} trained)" if tok \
            else "not tokenized"
        c = g["counts"]
        print(f"  {g['shard_id']}: {c['completed']} completed ({g['truncated']} cut by "
              f"max_tokens), {c['skipped']} skipped, {c['failed']} failed -> {tokens}")
    _token_summary(mirror, work / "sampled")
    for report in sorted((mirror / "report").glob("*/report.html")):
        print(f"report:           {report}")
    print("open the UI:      ./dev ui   (then http://127.0.0.1:8080, DAG "
          "regenerate_drafter_data)")


def _token_summary(mirror: Path, sampled_dir: Path) -> None:
    """Print how the rows compare with what the stand-in servers sampled (their own log)."""
    import pyarrow.parquet as pq

    from sglang_standin.testing import read_sampled_log

    sampled = read_sampled_log(sampled_dir)
    rows = exact = differs = 0
    for path in sorted((mirror / "tokenized").glob("*.parquet")):
        table = pq.read_table(path)
        for ids, mask in zip(table["input_ids"].to_pylist(), table["loss_mask"].to_pylist(),
                             strict=True):
            rows += 1
            masked = [t for t, m in zip(ids, mask, strict=True) if m]
            exact += masked in sampled.get(tuple(ids[: mask.index(1)]), [])
        manifest = json.loads(path.with_suffix("").with_suffix(".manifest.json").read_text())
        differs += manifest["counts"]["retokenized_text_differs"]
    print(f"token ids:        {exact} of {rows} rows are exactly the servers' prompt ids + "
          f"sampled ids; re-tokenizing the text would have changed {differs} of them (the "
          "stand-ins sample 0.2% of words as a non-canonical split; on real servers each "
          "tokenized manifest counts it: retokenized_text_differs)")


if __name__ == "__main__":
    sys.exit(main())
