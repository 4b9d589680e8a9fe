"""Run one prompt shard outside Airflow: ``python -m include.generation --help``.

Same code path as the DAG's generate task: the same ``check_settings`` first (run settings
from ``--settings``/``--set``, deployment settings from the ``REGEN_*`` environment), the same
store opening (protected prefixes, the deployment's S3 connection), then the shard is read from
the run's store, progress goes to stderr, finished prompts go to the shard's journal, and a
re-run resumes.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from include.generation.engine import GenerationError
from include.generation.shard import generate_shard
from include.prompts.plan import open_run_store
from include.settings import SettingsError
from include.settings.checks import check_settings
from include.storage import StoreError


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the shard, print its summary as JSON; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m include.generation", description=__doc__)
    parser.add_argument("--shard", required=True, help="shard id, e.g. shard-00042")
    parser.add_argument("--servers", required=True,
                        help="comma-separated server base URLs, e.g. http://gpu1:30000,...")
    parser.add_argument("--settings", help="JSON file of run settings (same names as the "
                        "trigger form); deployment settings come from REGEN_* variables")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override one setting (repeatable); VALUE is JSON or a string")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                        stream=sys.stderr)
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
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
