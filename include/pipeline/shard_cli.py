"""Run one prompt shard outside Airflow: ``python -m include.pipeline.shard_cli --help``.

Same code path as the DAG's generate task: the same ``check_settings`` first (run settings
from ``--settings``/``--set``, deployment settings from the ``REGEN_*`` environment), the same
store opening (protected prefixes, the deployment's S3 connection), then the shard is read from
the run's store, progress goes to stderr, finished prompts go to the shard's journal, and a
re-run resumes. Stdout holds one line, the shard's summary as JSON, and nothing else.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from include.engine.dispatch import GenerationError
from include.generation.shard import generate_shard
from include.pipeline.binding import open_run_store
from include.pipeline.check_settings import check_settings
from include.settings import SettingsError
from include.storage import StoreError


@contextmanager
def stdout_for_summary() -> Iterator[TextIO]:
    """Yield a stream on the real stdout, while all else bound for stdout goes to stderr.

    Importing Airflow (``airflow.sdk``, lazily, when the API key's connection is read)
    reconfigures logging with handlers writing to stdout, whatever was configured before. So
    for the whole run file descriptor 1 and ``sys.stdout`` point to stderr, and only the
    summary is written to the saved stdout.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    previous, sys.stdout = sys.stdout, sys.stderr
    summary = os.fdopen(os.dup(saved), "w", encoding="utf-8")
    try:
        yield summary
    finally:
        summary.close()
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)
        sys.stdout = previous


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the shard, print its summary as JSON; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m include.pipeline.shard_cli",
                                     description=__doc__)
    parser.add_argument("--shard", required=True, help="shard id, e.g. shard-00042")
    parser.add_argument("--servers", required=True,
                        help="comma-separated server base URLs, e.g. http://gpu1:30000,...")
    parser.add_argument("--settings", help="JSON file of run settings (same names as the "
                        "trigger form); deployment settings come from REGEN_* variables")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override one setting (repeatable); VALUE is JSON or a string")
    args = parser.parse_args(argv)
    with stdout_for_summary() as out:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                            stream=sys.stderr)
        return _run(args, out)


def _run(args: argparse.Namespace, out: TextIO) -> int:
    values = {}
    if args.settings:
        with open(args.settings, encoding="utf-8") as fh:
            values.update(json.load(fh))
    for item in args.set:
        name, _, raw = item.partition("=")
        try:
            values[name] = json.loads(raw)
        except ValueError:
            values[name] = raw
    try:
        settings = check_settings(values)
        summary = generate_shard(settings, args.shard, args.servers.split(","),
                                 open_run_store(settings))
    except (SettingsError, GenerationError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
