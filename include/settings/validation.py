"""Checks of a run's settings that need only the settings, the storage and the layout.

Each raises SettingsError naming the setting, the value and what is accepted. The
``check_settings`` task (``include.pipeline.check_settings``) runs them beside the checks
that need the stages (a source's first row, the tokenizer, the servers' keys), and reports
every problem at once. The only write is the create-only probe of an S3 store, in the run's
location, on every run (``include.storage.probe``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from include.layout import (
    JOURNAL_PREFIX,
    JOURNAL_SETTINGS_SUFFIX,
    MANIFEST_KEY,
    journal_settings_key,
    shard_id,
    started_key,
)
from include.settings.deployment import env_name
from include.settings.errors import SettingsError
from include.settings.run import (
    COMPLETION_SETTINGS,
    NEUTRAL_VALUES,
    PREPARATION_SETTINGS,
    RunSettings,
)

if TYPE_CHECKING:
    from include.storage import Store

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


class JournalSettingsError(SettingsError):
    """A shard's journal was written under other completion settings than this run's."""


#: How many shards a refusal names before it only counts the rest.
_NAMED_SHARDS = 5
#: Settings records read at once (on S3 each is one GET of a few hundred bytes).
_READ_THREADS = 16


def completion_record(run: RunSettings, **extra: Any) -> dict[str, Any]:
    """Return the settings record a shard's journal is written under (``COMPLETION_SETTINGS``)."""
    return {"fingerprint": run.fingerprint(COMPLETION_SETTINGS),
            "settings": run.subset(COMPLETION_SETTINGS), **extra}


def _value(settings: dict[str, Any], name: str) -> Any:
    # ``subset`` leaves a setting out at its neutral value: absent means that value.
    return settings[name] if name in settings else NEUTRAL_VALUES.get(name)


def _show(value: Any) -> str:
    return "empty" if value is None else json.dumps(value, ensure_ascii=False)


def completion_differences(run: RunSettings, record: dict[str, Any]) -> list[str]:
    """Return ``"name old → new"`` for each completion setting ``record`` differs in."""
    if record.get("fingerprint") == run.fingerprint(COMPLETION_SETTINGS):
        return []
    ours, theirs = run.subset(COMPLETION_SETTINGS), record.get("settings") or {}
    # Compared setting by setting, not by fingerprint alone: a fingerprint that differs only
    # because a setting left COMPLETION_SETTINGS shapes nothing that is still sent.
    return [f"{n} {_show(_value(theirs, n))} → {_show(_value(ours, n))}"
            for n in COMPLETION_SETTINGS if _value(theirs, n) != _value(ours, n)]


def _few(shards: list[str]) -> str:
    named = ", ".join(shards[:_NAMED_SHARDS])
    more = len(shards) - _NAMED_SHARDS
    return f"{named} and {more} more" if more > 0 else named


def _groups(groups: dict[str, list[str]]) -> str:
    return "; ".join(f"{diff} ({len(shards)} shard{'s' * (len(shards) != 1)}: {_few(shards)})"
                     for diff, shards in sorted(groups.items()))


def journal_refusal(run: RunSettings, where: str,
                    groups: dict[str, list[str]]) -> JournalSettingsError:
    """Return the refusal of a resume: per set of differing settings, the shards affected."""
    total = sum(len(shards) for shards in groups.values())
    return JournalSettingsError(
        f"setting `run_name` ({run.run_name!r}): {total} of the chosen shards already have "
        f"journals at {where} written under other completion settings: {_groups(groups)}. "
        "Resuming them would mix completions sampled under both settings in one shard. Use "
        "the same settings to resume them, or set `force_regenerate` to generate the chosen "
        "shards again into a new folder (regenerations/<Airflow run id>/ under the run), "
        "leaving the earlier journals and outputs untouched")


def read_journal_records(store: Store, shards: set[str] | None = None
                         ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Return (settings record per shard, shards whose journal records no settings).

    One delimiter listing of ``journal/`` (a few entries per shard, however many segments
    each journal holds), then only the records: no segment is listed or read. ``shards``
    limits both to those shards.
    """
    keys, folders = store.list_children(JOURNAL_PREFIX)
    lead = len(JOURNAL_PREFIX) + 1
    journals = {f[lead:].rstrip("/") for f in folders}
    recorded = {k[lead:-len(JOURNAL_SETTINGS_SUFFIX)]: k for k in keys
                if k.endswith(JOURNAL_SETTINGS_SUFFIX)}
    if shards is not None:
        journals &= shards
        recorded = {s: k for s, k in recorded.items() if s in shards}
    names = sorted(recorded)
    with ThreadPoolExecutor(max(1, min(_READ_THREADS, len(names)))) as pool:
        blobs = list(pool.map(store.read, [recorded[s] for s in names]))
    records = {s: json.loads(b) for s, b in zip(names, blobs, strict=True)}
    return records, sorted(journals - set(recorded))


def _warn_unrecorded(shards: list[str], where: str) -> None:
    log.warning("%d shard journals at %s record no completion settings (written before "
                "journals recorded them): whether they were sampled under this run's settings "
                "cannot be told; resuming them as they are: %s", len(shards), where, _few(shards))


def check_earlier_journals(run: RunSettings) -> None:
    """Refuse a resume of chosen shards whose journals hold other completion settings.

    The chosen shards are ``shard_range``'s (all without one, or when no prompt shards exist
    yet). With ``force_regenerate`` they are generated into a fresh folder: the differences
    are only logged, and each shard's record there says why it was regenerated.
    """
    from include.storage import open_store

    store = open_store(run.run_uri, read_only=True, s3_conn_id=run.deployment.s3_conn_id)
    chosen = None
    if store.exists(MANIFEST_KEY):
        total = len(json.loads(store.read(MANIFEST_KEY))["shards"])
        chosen = {shard_id(n) for n in run.shard_numbers(total)}
    records, unrecorded = read_journal_records(store, chosen)
    where = store.uri(JOURNAL_PREFIX)
    groups: dict[str, list[str]] = {}
    for shard, record in records.items():
        differ = completion_differences(run, record)
        if differ:
            groups.setdefault(", ".join(differ), []).append(shard)
    if unrecorded:
        _warn_unrecorded(unrecorded, where)
    if not groups:
        return
    if run.force_regenerate:
        log.info("force_regenerate: journals at %s hold other completion settings; the "
                 "chosen shards are generated again into a new folder: %s", where,
                 _groups(groups))
        return
    raise journal_refusal(run, where, groups)


def check_shard_journal(run: RunSettings, store: Store, shard: str) -> dict[str, Any] | None:
    """Refuse to resume ``shard`` if its journal in ``store`` holds other completion settings.

    Returns the journal's settings record, or None when there is none (a journal written
    before journals recorded settings is resumed, with a warning).
    """
    try:
        record = json.loads(store.read(journal_settings_key(shard)))
    except FileNotFoundError:
        if store.exists(started_key(shard)):
            _warn_unrecorded([shard], store.uri(JOURNAL_PREFIX))
        return None
    differ = completion_differences(run, record)
    if differ:
        raise journal_refusal(run, store.uri(JOURNAL_PREFIX), {", ".join(differ): [shard]})
    return record


def record_shard_settings(run: RunSettings, store: Store, shard: str,
                          **extra: Any) -> dict[str, Any]:
    """Write the settings record ``shard``'s journal is written under; return the record.

    Create-only, once per journal: a resume finds it and is refused if its settings differ.
    A journal started before records existed gets one that says so
    (``"unrecorded_before": true``): what it holds from then on is known.
    """
    from include.storage import ObjectExistsError

    existing = check_shard_journal(run, store, shard)
    if existing is not None:
        return existing
    if store.exists(started_key(shard)):
        extra["unrecorded_before"] = True
    record = completion_record(run, **extra)
    try:
        store.write_new(journal_settings_key(shard),
                        json.dumps(record, sort_keys=True, indent=1).encode())
    except ObjectExistsError:  # another try wrote it first: its settings decide
        return check_shard_journal(run, store, shard) or record
    return record


def regeneration_reason(run: RunSettings, earlier: Store, shard: str) -> str:
    """Return why ``force_regenerate`` generates ``shard`` again, against its ``earlier``
    journal (the run's own location): for the shard's record and the report."""
    try:
        record = json.loads(earlier.read(journal_settings_key(shard)))
    except FileNotFoundError:
        if earlier.exists(started_key(shard)):
            return ("force_regenerate: the earlier journal records no settings (written "
                    "before journals recorded them)")
        return "force_regenerate: no earlier journal of this shard"
    differ = completion_differences(run, record)
    if differ:
        return f"force_regenerate: settings differ from the earlier journal: {', '.join(differ)}"
    return "force_regenerate: same settings as the earlier journal"


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
