"""Measure the report over a run's files: from each shard's facts, against from its rows.

Writes ``--shards`` shards of ``--rows`` completions twice into local stores with the stages'
own builders (``tests/unit/reporting/synthetic_run.py``), each completion carrying what a real
one does (a ``--answer-chars`` answer's text, its ``--answer-tokens`` sampled ids and the
prompt's ids, as SGLang 0.5.23 returns them): once as shards are published now (the upload
task's ``generated/<shard>.facts.json``, every sample's length in the tokenized manifest), once
as before issue 28 (the report read every journal record and each parquet's columns). Builds
the report over each, plots off (their cost does not depend on the rows), in a fresh child
process per build: seconds, peak RSS (``VmHWM``) and bytes read. Both builds must agree on
every figure. Run at two sizes to see how each grows.

    .venv/bin/python -m benchmarks.bench_report [--shards 10] [--rows 1000]

Prints a table, then one JSON line: ``seconds``, ``peak_rss_mb``, ``bytes_read`` for the facts
and ``baseline_*`` for the rows, ``speedup`` (baseline seconds / seconds), ``same_report``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: What is not a figure of the run: where each copy's files are.
PLACES = ("report_uri", "outputs_uri", "dataset_card", "trainer_export")


def write(root: Path, shards: int, rows: int, answer_chars: int, answer_tokens: int,
          before_facts: bool) -> list[str]:
    """Write the synthetic run under ``root``; return its shard ids."""
    from include.storage import LocalStore
    from tests.unit.reporting.synthetic_run import ShardSpec, write_run

    answer = ("The answer, reasoned out at length. " * (answer_chars // 36 + 1))[:answer_chars]
    extra = {"text": answer, "prompt_token_ids": list(range(300)),
             "response_token_ids": list(range(answer_tokens))}
    specs = {f"shard-{i:05d}": ShardSpec(completed=rows, truncated=rows // 20, failed=2,
                                         extra=extra, before_facts=before_facts)
             for i in range(shards)}
    write_run(LocalStore(str(root)), specs)
    return list(specs)


def build(root: Path, shard_ids: list[str]) -> dict[str, Any]:
    """Build the report over ``root`` in this (fresh) process; return its figures and costs."""
    from include.reporting import QualityGates, build_report
    from include.storage import LocalStore
    from tests.fixtures.settings import run_settings

    class Counting(LocalStore):
        read_bytes = 0

        def read(self, key: str) -> bytes:
            data = super().read(key)
            Counting.read_bytes += len(data)
            return data

    store = Counting(str(root))
    settings = run_settings({"run_name": "syn"}, output_root=str(root.parent))
    gates = QualityGates(max_truncation_rate=1.0, max_failure_rate=1.0,
                         max_quarantine_rate=1.0)
    t = time.perf_counter()
    build_report(settings, store, store, shard_ids, [], run_id="bench", gates=gates,
                 plots=False)
    seconds = time.perf_counter() - t
    report = json.loads(Path(root, "report", "bench", "report.json").read_text())
    for key in PLACES:
        report.pop(key, None)
    for key in ("outputs_uri", "run_uri"):
        report["run"].pop(key, None)
    hwm = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
               if line.startswith("VmHWM:"))
    return {"seconds": round(seconds, 3), "peak_rss_mb": round(hwm / 1024, 1),
            "bytes_read": Counting.read_bytes, "report": report}


def build_in_child(root: Path, shard_ids: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_report", "--build", str(root),
         "--shard-ids", ",".join(shard_ids)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        check=False)
    if out.returncode:
        raise SystemExit(f"the report build over {root} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=10)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--answer-chars", type=int, default=8000)
    parser.add_argument("--answer-tokens", type=int, default=2000)
    parser.add_argument("--build", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--shard-ids", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.build:
        print(json.dumps(build(args.build, args.shard_ids.split(","))))
        return 0

    work = Path(tempfile.mkdtemp(prefix="bench-report-"))
    try:
        results = {}
        for name, before in (("facts", False), ("rows", True)):
            root = work / name / "runs" / "syn"
            t = time.perf_counter()
            ids = write(root, args.shards, args.rows, args.answer_chars, args.answer_tokens,
                        before)
            written = time.perf_counter() - t
            results[name] = {**build_in_child(root, ids), "write_s": round(written, 1)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    facts, rows = results["facts"], results["rows"]
    same = facts.pop("report") == rows.pop("report")
    print(f"{'':8} {'seconds':>9} {'peak RSS MB':>12} {'bytes read':>14}")
    for name, r in results.items():
        print(f"{name:8} {r['seconds']:9.2f} {r['peak_rss_mb']:12.1f} {r['bytes_read']:14,}")
    out = {"bench": "report", "shards": args.shards, "rows": args.rows,
           "answer_chars": args.answer_chars, "answer_tokens": args.answer_tokens,
           "seconds": facts["seconds"], "peak_rss_mb": facts["peak_rss_mb"],
           "bytes_read": facts["bytes_read"], "baseline_seconds": rows["seconds"],
           "baseline_peak_rss_mb": rows["peak_rss_mb"], "baseline_bytes_read": rows["bytes_read"],
           "speedup": round(rows["seconds"] / facts["seconds"], 2) if facts["seconds"] else None,
           "same_report": same, "cpus": os.cpu_count()}
    print(json.dumps(out))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
