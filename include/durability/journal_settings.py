"""The completion settings a shard's journal is written under, and the refusal to mix them.

Each shard's journal records, once and create-only, the settings that shape its completions
(``journal/<shard>.settings.json``): a resume under other settings would mix two samplings
in one shard. ``check_earlier_journals`` refuses that for every chosen shard before any work
(``check_settings``), ``check_shard_journal`` again in the generate task, naming each
difference; ``force_regenerate`` generates the shard again elsewhere, with its reason.
"""

from __future__ import annotations

import json
import logging
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
from include.settings import RunSettings, SettingsError
from include.settings.run import COMPLETION_SETTINGS, NEUTRAL_VALUES

if TYPE_CHECKING:
    from include.storage import Store

log = logging.getLogger(__name__)


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
