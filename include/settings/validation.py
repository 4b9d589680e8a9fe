"""Checks of a run's settings that need only the settings, the storage and the layout.

Each raises SettingsError naming the setting, the value and what is accepted; the
``check_settings`` task (``include.pipeline.check_settings``) runs them beside the checks
that need the stages, and reports every problem at once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from include.layout import (
    MANIFEST_KEY,
)
from include.settings.deployment import env_name
from include.settings.errors import SettingsError
from include.settings.run import (
    PREPARATION_SETTINGS,
    RunSettings,
)

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


def problem(fn: Callable[[], None]) -> list[str]:
    """Return the problems ``fn`` raises, one sentence each (empty when it passes)."""
    try:
        fn()
    except SettingsError as exc:
        return list(exc.problems)
    except (OSError, ValueError, RuntimeError) as exc:
        return [str(exc)]
    return []


def check_output_location(run: RunSettings) -> None:
    """Refuse a run location inside (or holding) a protected prefix."""
    from include.storage import StoreError, validate_output_location

    try:
        validate_output_location(run.run_uri, run.deployment.protected_prefixes)
    except StoreError as exc:
        raise SettingsError(f"setting `run_name` ({run.run_name!r}) under the deployment's "
                            f"output root ({env_name('output_root')}): {exc}") from None


def check_dedupe(index: int, run: RunSettings) -> None:
    """Refuse a ``dedupe_against`` location that cannot be read."""
    from include.storage import StoreError, check_readable

    try:
        check_readable(run.dedupe_against[index], run.deployment.s3_conn_id)
    except StoreError as exc:
        raise SettingsError(f"setting `dedupe_against[{index}]`: {exc}") from None


def check_earlier_shards(run: RunSettings) -> None:
    """Refuse now what prepare would refuse later: other preparation settings, a bad range."""
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


def check_served_name(run: RunSettings) -> None:
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


def check_store_create_only(run: RunSettings) -> None:
    """Refuse a store that overwrites existing keys where this run writes, probed now.

    The probe goes in the run's own location (``include.storage.probe``), on every run: a
    store can change behind its endpoint, or by prefix, between runs.
    """
    from include.storage import StoreError, open_store
    from include.storage.probe import prove_create_only

    root = run.deployment.output_root
    if not root.startswith("s3://"):
        return  # a local directory is create-only by construction (O_EXCL)
    try:
        store = open_store(run.run_uri, s3_conn_id=run.deployment.s3_conn_id,
                           protected_prefixes=run.deployment.protected_prefixes)
        how = prove_create_only(store)
    except StoreError as exc:
        raise SettingsError(f"deployment setting `output_root` ({env_name('output_root')} = "
                            f"{root!r}), run location {run.run_uri}: {exc}") from None
    log.info("run location %s is create-only (%s)", run.run_uri, how)


def describe(run: RunSettings) -> str:
    """Return the resolved settings as log lines (no secret: the API key only by name)."""
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
