"""Run the DAG end to end on the bundled sample files with local defaults.

Called by ``./dev demo``: migrates a local SQLite Airflow home (``.airflow/``), runs
``airflow dags test`` on the DAG, and prints where the outputs are.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DAG_ID = "regenerate_drafter_data"


def main() -> int:
    """Run the demo; return the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-name", default=time.strftime("demo-%Y%m%d-%H%M%S").lower())
    parser.add_argument("--output-uri", default=str(ROOT / "var" / "runs"))
    args = parser.parse_args()
    conf = {"run_name": args.run_name, "output_uri": args.output_uri, "shard_size": 100}
    env = dict(os.environ)
    print(f"==> airflow db migrate (AIRFLOW_HOME={env.get('AIRFLOW_HOME')})", flush=True)
    subprocess.run(["airflow", "db", "migrate"], check=True, env=env, stdout=subprocess.DEVNULL)
    print(f"==> airflow dags test {DAG_ID} -c '{json.dumps(conf)}'", flush=True)
    proc = subprocess.run(["airflow", "dags", "test", DAG_ID, "-c", json.dumps(conf)], env=env)
    run_dir = Path(args.output_uri) / args.run_name
    print()
    print(f"run outputs:      {run_dir}")
    manifest = run_dir / "prompts" / "manifest.json"
    if manifest.exists():
        from include.prompts import format_funnel

        data = json.loads(manifest.read_text())
        print(f"prompt manifest:  {manifest}")
        print(format_funnel(data))
    print("open the UI:      AIRFLOW_HOME=.airflow PYTHONPATH=. .venv/bin/airflow standalone")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
