"""``check_settings``: every mistake that can be known before any work, found in seconds.

It reads: the run's conf against the deployment, the output location against the protected
prefixes, the sources and ``dedupe_against`` locations, the tokenizer, the prompt shards an
earlier run prepared (for ``shard_range`` and reuse), whether servers on a non-loopback host
would get an API key, and whether each GPU host's SSH connection pins the host's key. The only
write is the create-only probe of an S3 output root (``include.storage.probe``), once per root
and endpoint. Every problem found is reported at once, each
naming the setting, the value and what is accepted; nothing is prepared, launched or written.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from include.settings.deployment import DeploymentSettings, env_name, inside_data_roots
from include.settings.errors import SettingsError, raise_all
from include.settings.run import PREPARATION_SETTINGS, RunSettings

log = logging.getLogger(__name__)

def _problem(fn: Callable[[], None]) -> list[str]:
    try:
        fn()
    except SettingsError as exc:
        return [str(exc)]
    except (OSError, ValueError, RuntimeError) as exc:
        return [str(exc)]
    return []


def _check_output_location(run: RunSettings) -> None:
    from include.storage import StoreError, validate_output_location

    try:
        validate_output_location(run.run_uri, run.deployment.protected_prefixes)
    except StoreError as exc:
        raise SettingsError(f"setting `run_name` ({run.run_name!r}) under the deployment's "
                            f"output root ({env_name('output_root')}): {exc}") from None


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
    from include.prompts.prepare import check_layout

    try:
        check_layout(source)  # the first row: its columns fit the kind and the filters
    except Exception as exc:  # noqa: BLE001 - the reader's message names source and columns
        raise SettingsError(f"{where}: {exc}") from None


def _check_dedupe(index: int, run: RunSettings) -> None:
    from include.storage import StoreError, check_readable

    try:
        check_readable(run.dedupe_against[index], run.deployment.s3_conn_id)
    except StoreError as exc:
        raise SettingsError(f"setting `dedupe_against[{index}]`: {exc}") from None


def _check_tokenizer(run: RunSettings) -> None:
    if not run.tokenizer_path:
        return
    from include.tokenization import load_tokenizer

    try:
        load_tokenizer(run.tokenizer_path)
    except Exception as exc:  # noqa: BLE001 - TokenizerError names the path and the fix
        raise SettingsError(f"setting `tokenizer_path`: {exc}") from None


def _check_earlier_shards(run: RunSettings) -> None:
    """Refuse now what prepare would refuse later: other preparation settings, a bad range."""
    from include.prompts.prepare import MANIFEST_KEY
    from include.storage import open_store

    store = open_store(run.run_uri, read_only=True, s3_conn_id=run.deployment.s3_conn_id)
    if not store.exists(MANIFEST_KEY):
        if run.shard_range:
            log.info("no prompt shards yet at %s: shard_range %r is checked after preparing",
                     run.run_uri, run.shard_range)
        return
    manifest = json.loads(store.read(MANIFEST_KEY))
    if manifest.get("preparation_fingerprint") != run.fingerprint(PREPARATION_SETTINGS):
        differ = run.preparation_differences(manifest)
        raise SettingsError(
            f"setting `run_name` ({run.run_name!r}): prompt shards at {run.run_uri} were "
            f"prepared with other preparation settings (different: {differ}); use the same "
            "settings to reuse them (e.g. for a shard_range backfill), or a new run_name")
    run.shard_numbers(len(manifest["shards"]))


#: Served names SGLang takes with ':' all the same: object-storage URIs
#: (``utils/runai_utils.py`` ``is_runai_obj_uri``, checked in ``arg_groups/validation_hook.py``).
_OBJECT_STORE_SCHEMES = ("s3://", "gs://", "az://")


def _check_served_name(run: RunSettings) -> None:
    """Refuse a served name SGLang exits on: the model path, when no served name is set.

    ``served_model_name`` itself refuses ':' by its pattern; the servers are launched with
    ``--served-model-name`` set to ``model_name``, which is the model path when it is empty.
    """
    if run.served_model_name or ":" not in run.model_path:
        return
    if run.model_path.lower().startswith(_OBJECT_STORE_SCHEMES):
        return
    raise SettingsError(
        f"setting `model_path`: got {run.model_path!r} and no `served_model_name`, so the "
        "servers would be named after the model path, and SGLang exits at start-up on a served "
        "model name with ':' (reserved for LoRA adapters, 'model:adapter'); accepted: set "
        "`served_model_name` to a name of letters, digits and ._/- (e.g. "
        f"{_suggest_name(run.model_path)!r})")


def _suggest_name(model_path: str) -> str:
    tail = model_path.replace(":", "-").rstrip("/").rsplit("/", 1)[-1]
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in tail)[:200] or "model"


def _check_store_create_only(run: RunSettings) -> None:
    """Refuse an output store that overwrites existing keys (it ignores If-None-Match)."""
    from include.storage import StoreError, open_store
    from include.storage.probe import prove_create_only

    root = run.deployment.output_root
    if not root.startswith("s3://"):
        return  # a local directory is create-only by construction (O_EXCL)
    try:
        store = open_store(root, s3_conn_id=run.deployment.s3_conn_id,
                           protected_prefixes=run.deployment.protected_prefixes)
        how = prove_create_only(store)
    except StoreError as exc:
        raise SettingsError(f"deployment setting `output_root` ({env_name('output_root')} = "
                            f"{root!r}): {exc}") from None
    log.info("output root %s is create-only (%s)", root, how)


def _check_host_keys(run: RunSettings) -> None:
    """Refuse a GPU host whose SSH connection does not pin the host's key."""
    from include.servers.hosts import host_key_problems

    problems = []
    for i, host in enumerate(run.deployment.gpu_hosts):
        if not host.ssh_conn_id:
            continue
        try:
            from airflow.sdk import BaseHook

            extra = BaseHook.get_connection(host.ssh_conn_id).extra_dejson
        except Exception as exc:  # noqa: BLE001 - not found, or a broken secrets backend
            problems.append(f"deployment setting `gpu_hosts[{i}]` ({host.host}): cannot read "
                            f"SSH connection `{host.ssh_conn_id}` ({exc}); define it")
            continue
        problems += [f"deployment setting `gpu_hosts[{i}]` ({host.host}): {p}"
                     for p in host_key_problems(host.ssh_conn_id, extra)]
    raise_all(problems)


def _check_api_key(run: RunSettings) -> None:
    from include.servers.checks import key_problems

    raise_all(key_problems(run.deployment, run.api_key))


def _describe(run: RunSettings) -> str:
    d = run.deployment
    lines = [f"  {k} = {json.dumps(v)}" for k, v in run.to_dict().items() if k != "sources"]
    lines += [f"  sources[{i}] = {s.name} ({s.path or s.hub_id})"
              for i, s in enumerate(run.sources)]
    hosts = ", ".join(f"{h.host} gpus {h.gpus}" for h in d.gpu_hosts)
    lines += [
        f"run location: {run.run_uri} (protected: {', '.join(d.protected_prefixes) or 'none'})",
        f"GPU hosts: {hosts}; ports from {d.port_base}; API key: "
        f"{'from connection ' + repr(d.sglang_conn_id) if run.api_key else 'none'}",
    ]
    return "\n".join(lines)


def check_settings(params: Mapping[str, Any] | None,
                   deployment: DeploymentSettings | None = None) -> RunSettings:
    """Run every check that needs no GPU and writes nothing; raise SettingsError listing all.

    The check_settings task's whole body. Returns the bound settings, logged resolved.
    """
    run = RunSettings.from_mapping(params, deployment)
    problems = _problem(lambda: _check_output_location(run))
    for i in range(len(run.sources)):
        problems += _problem(lambda i=i: _check_source(i, run))
    for i in range(len(run.dedupe_against)):
        problems += _problem(lambda i=i: _check_dedupe(i, run))
    problems += _problem(lambda: _check_served_name(run))
    problems += _problem(lambda: _check_api_key(run))
    problems += _problem(lambda: _check_tokenizer(run))
    problems += _problem(lambda: _check_host_keys(run))
    if not problems:  # a valid output root: prove it create-only before anything writes
        problems += _problem(lambda: _check_store_create_only(run))
    if not problems:  # the run's location is valid: look at what an earlier run left there
        problems += _problem(lambda: _check_earlier_shards(run))
    raise_all(problems)
    log.info("settings checked; resolved:\n%s", _describe(run))
    from include.servers.checks import budget_line

    log.info("%s", budget_line(run))
    return run
