"""``check_settings``: every mistake that can be known before any work, found in seconds.

It reads: the run's conf against the deployment, the output location against the protected
prefixes, the sources and ``dedupe_against`` locations, the tokenizer, the prompt shards an
earlier run prepared (for ``shard_range`` and reuse), the completion settings the chosen
shards' journals were written under (a resume may not mix them), whether servers on a
non-loopback host would get an API key, and whether each GPU host's SSH connection pins the
host's key. The only write is the create-only probe of an S3 store, in the run's location,
on every run (``include.storage.probe``). Every problem found is reported at
once, each naming the setting, the value and what is accepted; nothing is prepared, launched
or written. Checks that need only the settings are in ``include.settings.validation``; those here
need a stage (a source's first row, the tokenizer, the servers' keys and connections).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from include.durability.journal_settings import check_earlier_journals
from include.pipeline.refusal import refuse
from include.settings import DeploymentSettings, RunSettings, SettingsError
from include.settings.deployment import env_name, inside_data_roots
from include.settings.errors import raise_all, refusal_lines, refusal_summary, refused_names
from include.settings.validation import (
    check_dedupe,
    check_earlier_shards,
    check_output_location,
    check_served_name,
    check_store_create_only,
    describe,
    problem,
)

log = logging.getLogger(__name__)


def _check_source(index: int, run: RunSettings) -> None:
    from include.prompts.readers import resolve_files

    source = run.sources[index]
    if not source.path:
        return  # a hub dataset: its id, config and revision are checked when it is read
    where = f"setting `sources[{index}]` ({source.name})"
    try:
        files = resolve_files(source)
    except Exception as exc:  # noqa: BLE001 - the reader's own message names the path
        raise SettingsError(f"{where}: {exc}") from None
    for f in files:
        if not inside_data_roots(f, run.deployment.data_roots):
            raise SettingsError(
                f"{where}: {f!r} resolves (through a link) to {os.path.realpath(f)!r}, outside "
                f"the data roots {run.deployment.data_roots} ({env_name('data_roots')})")
        try:
            with open(f, "rb") as fh:
                fh.read(1)
        except OSError as exc:
            raise SettingsError(f"{where}: cannot read {f!r} ({exc.strerror}); make it "
                                "readable by the Airflow workers") from None
    from include.prompts.sources import check_layout

    try:
        check_layout(source)  # the first row: its columns fit the kind and the filters
    except Exception as exc:  # noqa: BLE001 - the reader's message names source and columns
        raise SettingsError(f"{where}: {exc}") from None


def _check_tokenizer(run: RunSettings) -> None:
    if not run.tokenizer_path:
        return
    from include.target_tokenizer import load_tokenizer

    try:
        load_tokenizer(run.tokenizer_path)
    except Exception as exc:  # noqa: BLE001 - TokenizerError names the path and the fix
        raise SettingsError(f"setting `tokenizer_path`: {exc}") from None


def _check_host_keys(run: RunSettings) -> None:
    """Refuse a GPU host whose SSH connection does not pin the host's key."""
    from include.servers.hosts import connection_problems

    problems = [f"deployment setting `gpu_hosts[{i}]` ({host.host}): {p}"
                for i, host in enumerate(run.deployment.gpu_hosts) if host.ssh_conn_id
                for p in connection_problems(host.ssh_conn_id)]
    raise_all(problems)


def _check_api_key(run: RunSettings) -> None:
    from include.servers.expectations import key_problems

    raise_all(key_problems(run.deployment, run.api_key))


def _refused(problems: list[str], name: str) -> bool:
    """Whether a problem already refuses setting ``name`` (or one of its entries)."""
    return any(n == name or n.startswith((f"{name}[", f"{name}."))
               for n in refused_names(problems))


def check_settings(params: Mapping[str, Any] | None,
                   deployment: DeploymentSettings | None = None) -> RunSettings:
    """Run every check that needs no GPU and writes nothing; raise SettingsError listing all.

    The deployment's refusals (a model it does not allow, a path outside the data roots) do
    not stop the other checks: each check runs unless it would read a value already refused
    (a refused source, tokenizer or ``dedupe_against`` entry is not opened), so a person sees
    every problem on the first try. The store is probed and the earlier shards read only
    when nothing is wrong. Returns the bound settings, logged resolved.
    """
    settings, problems = RunSettings.bind(params, deployment)
    if settings is None:  # the values do not make settings: nothing else can be checked
        raise_all(problems)
        raise AssertionError("unreachable: unbound settings always name a problem")
    problems += problem(lambda: check_output_location(settings))
    if not _refused(problems, "sources"):  # indexes are the conf's only when none was refused
        for i in range(len(settings.sources)):
            problems += problem(lambda i=i: _check_source(i, settings))
    for i in range(len(settings.dedupe_against)):
        if not _refused(problems, f"dedupe_against[{i}]"):
            problems += problem(lambda i=i: check_dedupe(i, settings))
    problems += problem(lambda: check_served_name(settings))
    problems += problem(lambda: _check_api_key(settings))
    if not _refused(problems, "tokenizer_path"):
        problems += problem(lambda: _check_tokenizer(settings))
    problems += problem(lambda: _check_host_keys(settings))
    if not problems:  # a valid output root: prove it create-only before anything writes
        problems += problem(lambda: check_store_create_only(settings))
    if not problems:  # the run's location is valid: look at what an earlier run left there
        problems += problem(lambda: check_earlier_shards(settings))
    if not problems:  # the same prompts: would a resume mix completion settings in a shard?
        problems += problem(lambda: check_earlier_journals(settings))
    raise_all(problems)
    log.info("settings checked; resolved:\n%s", describe(settings))
    from include.servers.expectations import budget_line

    log.info("%s", budget_line(settings))
    _say_if_nothing_to_do(settings)
    return settings


def _say_if_nothing_to_do(settings: RunSettings) -> None:
    """Say now when every selected shard is already complete: the run will skip everything
    after ``launch_servers`` and end green (issue 34); the person may want a new run_name."""
    import json

    from include.layout import MANIFEST_KEY
    from include.pipeline.prepare_prompts import held_out_pending, nothing_to_do
    from include.prompts.plan import select_shards
    from include.storage import open_store

    if settings.force_regenerate:
        return  # a new folder: every shard runs
    store = open_store(settings.run_uri, read_only=True,
                       s3_conn_id=settings.deployment.s3_conn_id)
    if not store.exists(MANIFEST_KEY):
        return
    manifest = json.loads(store.read(MANIFEST_KEY))
    if held_out_pending(settings, manifest, store):
        return  # the target still answers the held-out split
    idle = nothing_to_do(settings, select_shards(settings, manifest, store))
    if idle:
        log.warning("%s", idle)


def run(params: Mapping[str, Any] | None) -> None:
    """The check_settings task: fail, without a retry, on any wrong setting (each problem on
    lines of its own: ``include.pipeline.refusal``)."""
    try:
        check_settings(params)
    except SettingsError as exc:
        problems = exc.problems
    else:
        return
    refuse(refusal_summary(problems), [
        *refusal_lines(problems),
        "nothing was prepared, launched or written: change the settings and trigger again"])
