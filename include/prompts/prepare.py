"""The prepare stage: source rows in, deduplicated deterministic prompt shards out.

Every row read ends in exactly one place: a prompt in one shard, or a count under one drop
reason in the manifest's funnel (``read == kept + sum(drops)`` per source, checked before
anything is written). Memory stays flat in the number of rows: normalised prompts are spooled
to a local temporary file and only 16-byte dedupe keys and file offsets stay in memory.

Dedupe rule: sources are processed in settings order and rows in file order; the first
occurrence of a normalised prompt is kept and later ones are dropped as
``duplicate_within_source`` or ``duplicate_across_sources``. Quotas are applied after dedupe
by a seeded sample per source, so a quota counts distinct prompts. The kept prompts are then
shuffled with the seed (so each shard mixes sources and lengths) and cut into shards.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import tempfile
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from include.prompts.readers import MALFORMED_KEY, iter_batches
from include.prompts.schemas import KINDS, Kind, MalformedRow, check_kind, detect_kind
from include.prompts.turns import DropRow, dedupe_key, prompt_turns, to_messages
from include.settings import (
    AIRFLOW_MAX_MAP_LENGTH,
    PREPARATION_SETTINGS,
    RunSettings,
    SettingsError,
    SourceSettings,
)
from include.storage import Store, open_store, sha256_hex

log = logging.getLogger(__name__)

#: Every reason a row can be dropped for, in the order they are checked.
DROP_REASONS = (
    "malformed",
    "unknown_role",
    "no_user_turn",
    "empty",
    "filtered_language",
    "filtered_source",
    "too_short",
    "too_long",
    "already_in_existing_set",
    "duplicate_within_source",
    "duplicate_across_sources",
    "over_quota",
)
SAMPLE_IDS_PER_REASON = 5
PROMPTS_PREFIX = "prompts"
MANIFEST_KEY = f"{PROMPTS_PREFIX}/manifest.json"


class PrepareError(RuntimeError):
    """The prepare stage cannot go on; the message names the source or setting to fix."""


def shard_id(index: int) -> str:
    """Return the id of shard ``index`` (``shard-00042``), used in keys, logs and task names."""
    return f"shard-{index:05d}"


def shard_key(index: int) -> str:
    """Return the store key of prompt shard ``index``."""
    return f"{PROMPTS_PREFIX}/{shard_id(index)}.jsonl"


@dataclass
class SourceFunnel:
    """What happened to one source's rows."""

    name: str
    kind: str = ""
    read: int = 0
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    samples: dict[str, list[str]] = field(default_factory=dict)

    def drop(self, reason: str, row_id: str, detail: str = "") -> None:
        self.dropped[reason] += 1
        bucket = self.samples.setdefault(reason, [])
        if len(bucket) < SAMPLE_IDS_PER_REASON:
            bucket.append(f"{row_id} ({detail})" if detail else row_id)

    def check(self) -> None:
        total = self.kept + sum(self.dropped.values())
        if total != self.read:
            raise PrepareError(
                f"source {self.name!r}: funnel does not add up (read {self.read}, kept "
                f"{self.kept}, dropped {sum(self.dropped.values())}); this is a bug, nothing "
                "was written"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "read": self.read,
            "kept": self.kept,
            "dropped": {r: self.dropped[r] for r in DROP_REASONS if self.dropped[r]},
            "drop_samples": {r: self.samples[r] for r in DROP_REASONS if r in self.samples},
        }


class _Spool:
    """Kept prompts of one source, as JSON lines in a temporary file, addressed by offset."""

    def __init__(self, directory: str, name: str) -> None:
        self.path = Path(directory) / f"{name}.jsonl"
        self._fh = open(self.path, "wb")  # noqa: SIM115 - closed in finish()
        self._size = 0  # counted here: BufferedWriter.tell() is a system call each time
        self.offsets = array("q")

    def add(self, line: bytes) -> None:
        self.offsets.append(self._size)
        self._fh.write(line)
        self._size += len(line)

    def finish(self) -> None:
        self._fh.close()
        self.offsets.append(self.path.stat().st_size)


_JSON = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)
# One C encoder made once, instead of one per call as JSONEncoder.encode does (same bytes;
# records come from parsed data, so they cannot be circular and need no circular check).
_C_ENCODE = json.encoder.c_make_encoder and json.encoder.c_make_encoder(
    None,
    _JSON.default,
    json.encoder.encode_basestring,
    _JSON.indent,
    _JSON.key_separator,
    _JSON.item_separator,
    _JSON.sort_keys,
    _JSON.skipkeys,
    _JSON.allow_nan,
)


def encode_record(record: dict[str, Any]) -> bytes:
    """Return the one canonical JSON line for a record (sorted keys: byte-stable output).

    The same bytes as ``json.dumps(record, ensure_ascii=False, sort_keys=True,
    separators=(",", ":"), default=str) + "\\n"`` in UTF-8.
    """
    text = "".join(_C_ENCODE(record, 0)) if _C_ENCODE else _JSON.encode(record)
    return (text + "\n").encode("utf-8")


def _length_counter(settings: RunSettings) -> tuple[str, Any]:
    if settings.tokenizer_path:
        from include.tokenization import count_prompt_tokens, load_tokenizer

        tok = load_tokenizer(settings.tokenizer_path)
        return "tokens", lambda convs: count_prompt_tokens(tok, convs, settings.enable_thinking)
    return "characters", lambda convs: [sum(len(m["content"]) for m in c) for c in convs]


def load_existing_keys(settings: RunSettings) -> set[bytes]:
    """Return the dedupe keys of every prompt in the ``dedupe_against`` sets."""
    keys: set[bytes] = set()
    for location in settings.dedupe_against:
        store, prefix = _store_and_prefix(location)
        names = [k for k in store.list(prefix) if k.endswith((".jsonl", ".json"))]
        if not names:
            raise PrepareError(
                f"setting `dedupe_against`: {location!r} holds no .jsonl/.json files; fix the "
                "location or remove it"
            )
        before = len(keys)
        for name in names:
            for lineno, line in enumerate(store.read(name).splitlines(), 1):
                if not line.strip():
                    continue
                messages = _existing_messages(location, name, lineno, line)
                if messages:
                    keys.add(dedupe_key(prompt_turns(messages)))
        log.info("dedupe_against %s: %d prompts", location, len(keys) - before)
    return keys


def _store_and_prefix(location: str) -> tuple[Store, str]:
    if location.startswith("s3://"):
        return open_store(location), ""
    path = Path(location)
    if path.is_file():
        return open_store(str(path.parent)), path.name
    if path.is_dir():
        return open_store(str(path)), ""
    raise PrepareError(f"setting `dedupe_against`: {location!r} does not exist")


def _existing_messages(location: str, name: str, lineno: int, line: bytes) -> list[dict] | None:
    # Earlier prompt shards carry `messages`; SpecForge-style training sets carry
    # `conversations` with role/content (or from/value); both are accepted.
    try:
        record = json.loads(line)
        turns = record.get("messages") or record.get("conversations") or []
        return [
            {
                "role": _role(t.get("role") or t.get("from")),
                "content": t.get("content") if "content" in t else t.get("value"),
            }
            for t in turns
        ]
    except (json.JSONDecodeError, AttributeError, TypeError) as exc:
        raise PrepareError(
            f"setting `dedupe_against`: {location} {name} line {lineno} is not a prompt record "
            f"({exc}); expected JSON lines with `messages` or `conversations`"
        ) from None


def _role(name: Any) -> str:
    from include.prompts.schemas import ROLE_NAMES

    return ROLE_NAMES.get(str(name).lower(), str(name))


def _resolve_kind(source: SourceSettings, batch_columns: list[str], first: dict | None) -> Kind:
    if source.kind == "auto":
        return detect_kind(source.name, batch_columns, first)
    kind = KINDS[source.kind]
    check_kind(source.name, kind, batch_columns)
    return kind


def _check_filters(source: SourceSettings, kind: Kind) -> None:
    if source.languages is not None and not kind.language_column:
        raise SettingsError(
            f"setting `sources` ({source.name}): `languages` given but kind {kind.name!r} has "
            "no language column; remove `languages` for this source"
        )
    if source.exclude_sources and not kind.source_column:
        raise SettingsError(
            f"setting `sources` ({source.name}): `exclude_sources` given but kind "
            f"{kind.name!r} has no source column; remove it for this source"
        )


def _row_id(source: SourceSettings, kind: Kind, row: dict, index: int, seen: set[str]) -> str:
    config = source.config or "default"
    raw = row.get(kind.id_column) if kind.id_column else None
    rid = f"{source.name}:{config}:{raw if raw not in (None, '') else index}"
    if rid in seen:  # published ids are not always unique; the row index always is
        rid = f"{source.name}:{config}:{raw}#{index}"
    seen.add(rid)
    return rid


def _metadata(kind: Kind, row: dict, source: SourceSettings) -> dict[str, Any]:
    meta: dict[str, Any] = {"source_kind": kind.name}
    if source.config:
        meta["config"] = source.config
    for col in kind.metadata_columns:
        if row.get(col) is not None:
            meta[col] = row[col]
    if kind.extra_metadata:
        meta.update(kind.extra_metadata(row))
    return meta


def _read_source(
    si: int,
    source: SourceSettings,
    settings: RunSettings,
    spool: _Spool,
    seen_keys: dict[bytes, int],
    existing: set[bytes],
    count_lengths: Any,
) -> SourceFunnel:
    funnel = SourceFunnel(source.name)
    kind: Kind | None = None
    seen_ids: set[str] = set()
    languages = set(source.languages) if source.languages is not None else None
    excluded = set(source.exclude_sources)

    def select(columns: list[str], first: dict | None) -> tuple[str, ...]:
        # Resolve the kind before the first batch, so only the columns it reads are loaded.
        nonlocal kind
        kind = _resolve_kind(source, columns, first)
        _check_filters(source, kind)
        funnel.kind = kind.name
        return kind.columns

    for batch in iter_batches(source, select=select):
        if kind is None:
            first = next((r for r in batch.rows if MALFORMED_KEY not in r), None)
            kind = _resolve_kind(source, batch.columns, first)
            _check_filters(source, kind)
            funnel.kind = kind.name
        pending: list[tuple[str, list[dict[str, str]], dict[str, Any]]] = []
        for offset, row in enumerate(batch.rows):
            index = batch.start + offset
            funnel.read += 1
            if MALFORMED_KEY in row:
                funnel.drop(
                    "malformed",
                    f"{source.name}:{source.config or 'default'}:{index}",
                    row[MALFORMED_KEY],
                )
                continue
            rid = _row_id(source, kind, row, index, seen_ids)
            try:
                messages = to_messages(kind.turns(row), source.multi_turn)
            except MalformedRow as exc:
                funnel.drop("malformed", rid, str(exc))
                continue
            except DropRow as exc:
                funnel.drop(exc.reason, rid, exc.detail)
                continue
            if languages is not None and row.get(kind.language_column) not in languages:
                funnel.drop("filtered_language", rid, str(row.get(kind.language_column)))
                continue
            if excluded and row.get(kind.source_column) in excluded:
                funnel.drop("filtered_source", rid, str(row.get(kind.source_column)))
                continue
            pending.append((rid, messages, _metadata(kind, row, source)))
        lengths = count_lengths([m for _, m, _ in pending])
        for (rid, messages, meta), length in zip(pending, lengths, strict=True):
            if length < settings.min_prompt_length:
                funnel.drop("too_short", rid, str(length))
                continue
            if settings.max_prompt_length is not None and length > settings.max_prompt_length:
                funnel.drop("too_long", rid, str(length))
                continue
            key = dedupe_key(messages)
            if key in existing:
                funnel.drop("already_in_existing_set", rid)
                continue
            owner = seen_keys.get(key)
            if owner is not None:
                reason = "duplicate_within_source" if owner == si else "duplicate_across_sources"
                funnel.drop(reason, rid)
                continue
            seen_keys[key] = si
            funnel.kept += 1
            spool.add(
                encode_record(
                    {"id": rid, "source": source.name, "messages": messages, "metadata": meta}
                )
            )
    if kind is None:
        log.warning("source %s: no rows", source.name)
    return funnel


def _apply_quota(source: SourceSettings, funnel: SourceFunnel, n_kept: int, seed: int) -> list[int]:
    indices = list(range(n_kept))
    if source.quota is None or source.quota >= n_kept:
        return indices
    rng = random.Random(f"{seed}:{source.name}")
    chosen = sorted(rng.sample(indices, source.quota))
    dropped = n_kept - source.quota
    funnel.dropped["over_quota"] += dropped
    funnel.kept -= dropped
    return chosen


def plan_shards(total: int, shard_size: int) -> int:
    """Return the shard count for ``total`` prompts; raise SettingsError past Airflow's limit."""
    count = math.ceil(total / shard_size) if total else 0
    if count > AIRFLOW_MAX_MAP_LENGTH:
        need = math.ceil(total / AIRFLOW_MAX_MAP_LENGTH)
        raise SettingsError(
            f"setting `shard_size`: {shard_size} cuts {total} prompts into {count} shards, "
            f"more than Airflow maps in one task ({AIRFLOW_MAX_MAP_LENGTH}, "
            f"core.max_map_length); use shard_size >= {need}"
        )
    return count


def prepare_prompts(settings: RunSettings, store: Store | None = None) -> dict[str, Any]:
    """Run the prepare stage and return its manifest (also written to the store).

    Writes ``prompts/shard-NNNNN.jsonl`` and ``prompts/manifest.json`` under the run's
    location, create-only: run again with the same inputs and settings, it rewrites nothing
    and returns the same manifest; with different ones, it fails instead of overwriting.
    """
    store = store or open_store(settings.run_uri)
    unit, count_lengths = _length_counter(settings)
    log.info(
        "prepare: %d sources -> %s; shard_size=%d seed=%d prompt length in %s [%s, %s]",
        len(settings.sources),
        store.uri(PROMPTS_PREFIX),
        settings.shard_size,
        settings.seed,
        unit,
        settings.min_prompt_length,
        settings.max_prompt_length or "no bound",
    )
    existing = load_existing_keys(settings)
    seen_keys: dict[bytes, int] = {}
    funnels: list[SourceFunnel] = []
    with tempfile.TemporaryDirectory(prefix="prepare-") as tmp:
        spools: list[_Spool] = []
        selected: list[list[int]] = []
        for si, source in enumerate(settings.sources):
            spool = _Spool(tmp, f"{si:03d}")
            funnel = _read_source(si, source, settings, spool, seen_keys, existing, count_lengths)
            spool.finish()
            selected.append(_apply_quota(source, funnel, len(spool.offsets) - 1, settings.seed))
            funnel.check()
            funnels.append(funnel)
            spools.append(spool)
            log.info(
                "source %s (%s): read %d, kept %d",
                source.name,
                funnel.kind,
                funnel.read,
                funnel.kept,
            )
        del seen_keys

        order = [(si, i) for si, chosen in enumerate(selected) for i in chosen]
        random.Random(settings.seed).shuffle(order)
        n_shards = plan_shards(len(order), settings.shard_size)
        shards = _write_shards(store, spools, order, settings.shard_size, n_shards)

    manifest = {
        "stage": "prepare",
        "preparation_fingerprint": settings.fingerprint(PREPARATION_SETTINGS),
        "preparation_settings": {n: settings.to_dict()[n] for n in PREPARATION_SETTINGS},
        "length_unit": unit,
        "drop_reasons": list(DROP_REASONS),
        "sources": {f.name: f.to_dict() for f in funnels},
        "totals": {
            "read": sum(f.read for f in funnels),
            "kept": sum(f.kept for f in funnels),
            "dropped": sum(sum(f.dropped.values()) for f in funnels),
        },
        "shard_size": settings.shard_size,
        "shards": shards,
    }
    store.write_new(MANIFEST_KEY, json.dumps(manifest, indent=2).encode() + b"\n")
    log.info("prepare funnel:\n%s", format_funnel(manifest))
    log.info(
        "prepare: wrote %d prompts in %d shards to %s",
        manifest["totals"]["kept"],
        len(shards),
        store.uri(PROMPTS_PREFIX),
    )
    return manifest


def _write_shards(
    store: Store, spools: list[_Spool], order: list[tuple[int, int]], size: int, n_shards: int
) -> list[dict[str, Any]]:
    fds = [os.open(s.path, os.O_RDONLY) for s in spools]
    offsets = [s.offsets for s in spools]
    try:
        shards = []
        for n in range(n_shards):
            lines = []
            for si, i in order[n * size : (n + 1) * size]:
                start = offsets[si][i]
                length = offsets[si][i + 1] - start
                line = os.pread(fds[si], length, start)
                if len(line) != length:  # never seen on a local file; do not trust it
                    raise PrepareError(f"spool {spools[si].path} was cut short; nothing written")
                lines.append(line)
            data = b"".join(lines)
            created = store.write_new(shard_key(n), data)
            shards.append(
                {
                    "shard_id": shard_id(n),
                    "key": shard_key(n),
                    "count": len(lines),
                    "sha256": sha256_hex(data),
                    "bytes": len(data),
                }
            )
            if not created:
                log.info("%s already written with identical content; kept", shard_key(n))
        return shards
    finally:
        for fd in fds:
            os.close(fd)


def format_funnel(manifest: dict[str, Any]) -> str:
    """Return the manifest's funnel as a fixed-width table (one row per source)."""
    reasons = [
        r for r in DROP_REASONS if any(s["dropped"].get(r) for s in manifest["sources"].values())
    ]
    header = ["source", "read", "kept", *reasons]
    rows = [
        [name, str(s["read"]), str(s["kept"]), *(str(s["dropped"].get(r, 0)) for r in reasons)]
        for name, s in manifest["sources"].items()
    ]
    t = manifest["totals"]
    rows.append(
        [
            "TOTAL",
            str(t["read"]),
            str(t["kept"]),
            *(
                str(sum(s["dropped"].get(r, 0) for s in manifest["sources"].values()))
                for r in reasons
            ),
        ]
    )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in [header, *rows]
    )


def read_shard(store: Store, index: int) -> list[dict[str, Any]]:
    """Return the prompt records of shard ``index``."""
    return [json.loads(line) for line in store.read(shard_key(index)).splitlines() if line]


def shard_index(shard: str) -> int:
    """Return the index of a shard id (``shard-00042`` -> 42)."""
    prefix = "shard-"
    if not shard.startswith(prefix) or not shard[len(prefix):].isdigit():
        raise ValueError(f"not a shard id: {shard!r} (expected e.g. 'shard-00042')")
    return int(shard[len(prefix):])


def read_shard_by_id(store: Store, shard: str) -> list[dict[str, Any]]:
    """Return the prompt records of the shard named ``shard`` (e.g. ``shard-00042``)."""
    return read_shard(store, shard_index(shard))
