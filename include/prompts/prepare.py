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

import gc
import json
import logging
import math
import os
import random
import tempfile
import threading
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from hashlib import blake2b as _blake2b
from itertools import accumulate, repeat
from pathlib import Path
from typing import Any

import numpy as np

from include.prompts.readers import (
    MALFORMED_KEY,
    RowBatch,
    iter_batches,
    peek,
    resolve_files,
)
from include.prompts.schemas import (
    KINDS,
    ROLE_NAMES,
    Kind,
    MalformedRow,
    check_kind,
    detect_kind,
)
from include.prompts.turns import (
    EMPTY_DETAIL,
    INVALID_UNICODE_DETAIL,
    POLICIES,
    DropRow,
    _fold,
    dedupe_key,
    prompt_turns,
    to_messages,
)
from include.prompts.workers import map_in_order, usable_cpus
from include.settings import (
    PREPARATION_SETTINGS,
    RunSettings,
    SettingsError,
    SourceSettings,
)
from include.storage import Store, StoreError, open_readable, open_store, sha256_hex

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


@dataclass
class _Candidates:
    """One source's rows that passed every per-row check, before dedupe, in row order.

    Candidate ``c`` has dedupe key ``keys[16 * c : 16 * (c + 1)]`` and its JSON line at bytes
    ``[ends[c - 1], ends[c])`` of the file at ``path`` (``ends[-1]`` of nothing is 0). The
    funnel holds the source's reads and per-row drops; dedupe and quotas come after.
    """

    funnel: SourceFunnel
    path: str
    keys: bytearray = field(default_factory=bytearray)
    ends: array = field(default_factory=lambda: array("q"))

    def line(self, c: int) -> bytes:
        start = self.ends[c - 1] if c else 0
        with open(self.path, "rb") as fh:
            fh.seek(start)
            return fh.read(self.ends[c] - start)

    def row_id(self, c: int) -> str:
        # Only drop samples need a candidate's id after the per-row work (a few per source),
        # so it is read back from its line instead of being kept for every row.
        return json.loads(self.line(c))["id"]


@dataclass
class _Kept:
    """A source's kept prompts after dedupe: line ``i`` is at ``starts[i]`` in ``path``."""

    path: str
    starts: np.ndarray
    lengths: np.ndarray


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
    return (_encode(record) + "\n").encode("utf-8")


def _encode(value: Any) -> str:
    """Return ``value`` as encode_record writes it (any JSON value, not only records)."""
    return "".join(_C_ENCODE(value, 0)) if _C_ENCODE else _JSON.encode(value)


def _encode_str(text: str) -> str:
    """Return a string as encode_record writes it."""
    # The encoder escapes only quotes, backslashes and characters below U+0020 (all
    # non-printable); checking for those in C is cheaper than escaping a long prompt.
    if text.isprintable() and '"' not in text and "\\" not in text:
        return '"' + text + '"'
    return _escape_str(text)


#: The function encode_record's encoder uses for strings.
_escape_str = json.encoder.encode_basestring


def _length_counter(settings: RunSettings) -> tuple[str, Any]:
    if settings.tokenizer_path:
        from include.tokenization import count_prompt_tokens, load_tokenizer

        tok = load_tokenizer(settings.tokenizer_path)
        return "tokens", lambda convs: count_prompt_tokens(tok, convs, settings.enable_thinking)
    return "characters", lambda convs: [sum(len(m["content"]) for m in c) for c in convs]


def load_existing_keys(settings: RunSettings) -> KeySet:
    """Return the dedupe keys of every prompt in the ``dedupe_against`` sets.

    Each location is opened read-only with the run's S3 connection: it may well lie under a
    protected prefix (the original completions), and is never written.
    """
    keys = bytearray()
    for location in settings.dedupe_against:
        try:
            store, name = open_readable(location, s3_conn_id=settings.deployment.s3_conn_id)
            names = [k for k in store.list(name) if k.endswith((".jsonl", ".json"))]
        except StoreError as exc:
            raise PrepareError(f"setting `dedupe_against`: {exc}") from None
        if not names:
            raise PrepareError(
                f"setting `dedupe_against`: {location!r} does not exist or holds no .jsonl/.json "
                "files; fix the location or remove it"
            )
        before = len(keys)
        for name in names:
            for lineno, line in enumerate(store.read(name).splitlines(), 1):
                if not line.strip():
                    continue
                messages = _existing_messages(location, name, lineno, line)
                if messages:
                    keys += dedupe_key(prompt_turns(messages))
        log.info("dedupe_against %s: %d prompts", location, (len(keys) - before) // _KEY_BYTES)
    return KeySet.of(keys)


#: The size of a dedupe key (``turns.dedupe_key``).
_KEY_BYTES = 16


class KeySet:
    """Distinct dedupe keys, 16 bytes each: two arrays of their halves, sorted by the first.

    A Python set of 16-byte ``bytes`` takes about 100 bytes a key (the object and its slot),
    most of the stage's memory at the 3.5M prompts of the published sources. Keys are 128-bit
    blake2b digests of the normalised prompt: the chance that two different prompts among n
    share one is below n^2 / 2^129 (2^-85 at 3.5M prompts, 2^-82 at ten million), so equal
    keys are taken as equal prompts.
    """

    def __init__(self, hi: np.ndarray | None = None, lo: np.ndarray | None = None) -> None:
        self.hi = _NO_KEYS if hi is None else hi
        self.lo = _NO_KEYS if lo is None else lo

    @classmethod
    def of(cls, keys: bytes | bytearray) -> KeySet:
        """Return the distinct keys among ``keys`` (16 bytes each, concatenated)."""
        hi, lo = _halves(keys)
        new = ~_repeats(hi, lo)
        out = cls()
        out.add(hi[new], lo[new])
        return out

    def __len__(self) -> int:
        return len(self.hi)

    def add(self, hi: np.ndarray, lo: np.ndarray) -> None:
        """Add keys (given by their halves) that are not in the set yet."""
        # Merged in one pass, not sorted again: a source of a thousand rows after millions of
        # kept keys costs a copy of them, not a sort.
        order = np.argsort(hi, kind="stable")
        where = np.searchsorted(self.hi, hi[order])
        self.hi = np.insert(self.hi, where, hi[order])
        self.lo = np.insert(self.lo, where, lo[order])

    def contains(self, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        """Return, for each key given by its halves, whether the set holds it."""
        left = np.searchsorted(self.hi, hi, "left")
        right = np.searchsorted(self.hi, hi, "right")
        found = np.zeros(len(hi), dtype=bool)
        one = right - left == 1  # nearly always: first halves are 64 random bits
        found[one] = self.lo[left[one]] == lo[one]
        for q in np.flatnonzero(right - left > 1).tolist():  # keys sharing their first half
            found[q] = bool((self.lo[left[q] : right[q]] == lo[q]).any())
        return found


_NO_KEYS = np.empty(0, dtype=np.uint64)


def _halves(keys: bytes | bytearray) -> tuple[np.ndarray, np.ndarray]:
    """Return the first and second 8 bytes of each 16-byte key, as two uint64 arrays."""
    pairs = np.frombuffer(keys, dtype=np.uint64).reshape(-1, 2)
    return np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1])


def _repeats(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Return, for each key of a sequence, whether an earlier key of the sequence equals it."""
    order = np.lexsort((lo, hi))  # stable: equal keys stay in sequence order
    h, low = hi[order], lo[order]
    same = (h[1:] == h[:-1]) & (low[1:] == low[:-1])
    repeat = np.zeros(len(hi), dtype=bool)
    repeat[order[1:][same]] = True
    return repeat


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
    return ROLE_NAMES.get(str(name).lower(), str(name))


def _resolve_kind(source: SourceSettings, batch_columns: list[str], first: dict | None) -> Kind:
    if source.kind == "auto":
        return detect_kind(source.name, batch_columns, first)
    kind = KINDS[source.kind]
    check_kind(source.name, kind, batch_columns)
    return kind


def check_layout(source: SourceSettings) -> None:
    """Raise if a local source's layout does not fit its kind and filters (first row only)."""
    columns, first = peek(source)
    if first is None:
        return  # no rows: nothing to check, and the funnel will say the source was empty
    _check_filters(source, _resolve_kind(source, columns, first))


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


def _row_id(prefix: str, raw: Any, index: int, seen: set[str] | None) -> str:
    """Return ``<source>:<config>:<row id or index>`` (``prefix`` holds the first two parts).

    Unique in the source by construction: an id given before gets ``#<row index>`` appended
    (published ids repeat) until it is new, since the first such form may be a real id too
    (``a#2`` then ``a``, ``a``). The row index is unique per source, so one step is enough but
    for adversarial ids. Every id the earlier, unchecked rule gave once stays the same
    (``None#<index>`` for a missing id that repeats an index included), so existing outputs
    keep theirs. ``seen`` (every id given so far) is None when ids come from the row index,
    which is unique by itself.
    """
    if seen is None:
        return f"{prefix}{index}"
    rid = f"{prefix}{raw if raw not in (None, '') else index}"
    if rid in seen:
        rid = f"{prefix}{raw}#{index}"
        while rid in seen:
            rid = f"{rid}#{index}"
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


class _SourceReader:
    """The per-row work of one source: rows in, candidates (or counted drops) out.

    Everything a row goes through before dedupe happens here (ids, turns, filters, lengths,
    dedupe key, JSON line), so it can run in another process than the dedupe.
    """

    def __init__(
        self,
        source: SourceSettings,
        settings: RunSettings,
        unit: str,
        count_lengths: Any,
        out: _Candidates,
    ) -> None:
        self.source = source
        self.settings = settings
        self.unit = unit
        self.count_lengths = count_lengths
        self.out = out
        self.funnel = out.funnel
        self.kind: Kind | None = None
        self.seen_ids: set[str] = set()
        self.languages = set(source.languages) if source.languages is not None else None
        self.excluded = set(source.exclude_sources)
        self.id_prefix = f"{source.name}:{source.config or 'default'}:"

    def set_kind(self, columns: list[str], first: dict | None) -> Kind:
        self.kind = _resolve_kind(self.source, columns, first)
        _check_filters(self.source, self.kind)
        self.funnel.kind = self.kind.name
        return self.kind

    def column_wise(self, batch: RowBatch) -> bool:
        """Return whether a batch may take a column-wise path (else it goes row by row)."""
        kind = self.kind
        assert kind is not None
        return (
            batch.table is not None
            and (kind.text_column is not None or kind.turn_list is not None)
            and kind.extra_metadata is None
            and self.source.multi_turn in POLICIES
            and not {"source_kind", "config"} & set(kind.metadata_columns)
        )

    def batch(self, batch: RowBatch) -> tuple[list[bytes], list[bytes]]:
        """Return the keys and JSON lines of a batch's candidates, by the fastest exact path."""
        kind = self.kind
        assert kind is not None
        if self.column_wise(batch):
            if kind.text_column is not None:
                if self.unit == "characters" and self.languages is None:
                    return self.flat_columns(batch)
                return self.columns(batch, _flat_prompts(kind, batch.column(kind.text_column)))
            assert kind.turn_list is not None
            prompts = _turn_list_prompts(batch.table, kind.turn_list, self.source.multi_turn)
            if prompts is not None:
                return self.columns(batch, prompts)
        return self.rows(batch)

    def rows(self, batch: RowBatch) -> tuple[list[bytes], list[bytes]]:
        """Return the keys and JSON lines of a batch's candidates (any layout, row by row)."""
        kind, source, funnel = self.kind, self.source, self.funnel
        assert kind is not None
        pending: list[tuple[str, list[dict[str, str]], dict[str, Any]]] = []
        for offset, row in enumerate(batch.rows):
            index = batch.start + offset
            funnel.read += 1
            if MALFORMED_KEY in row:
                funnel.drop("malformed", f"{self.id_prefix}{index}", row[MALFORMED_KEY])
                continue
            rid = _row_id(self.id_prefix, row.get(kind.id_column) if kind.id_column else None,
                          index, self.seen_ids)
            try:
                messages = to_messages(kind.turns(row), source.multi_turn)
            except MalformedRow as exc:
                funnel.drop("malformed", rid, str(exc))
                continue
            except DropRow as exc:
                funnel.drop(exc.reason, rid, exc.detail)
                continue
            if self.languages is not None and row.get(kind.language_column) not in self.languages:
                funnel.drop("filtered_language", rid, str(row.get(kind.language_column)))
                continue
            if self.excluded and row.get(kind.source_column) in self.excluded:
                funnel.drop("filtered_source", rid, str(row.get(kind.source_column)))
                continue
            pending.append((rid, messages, _metadata(kind, row, source)))
        lengths = self.count_lengths([m for _, m, _ in pending])
        keys: list[bytes] = []
        lines: list[bytes] = []
        for (rid, messages, meta), length in zip(pending, lengths, strict=True):
            if not self._length_ok(rid, length):
                continue
            keys.append(dedupe_key(messages))
            lines.append(
                encode_record(
                    {"id": rid, "source": source.name, "messages": messages, "metadata": meta}
                )
            )
        return keys, lines

    def columns(self, batch: RowBatch, prompts: list[Any]) -> tuple[list[bytes], list[bytes]]:
        """Return what ``rows`` returns for a batch, given each row's prompt turns or drop.

        ``prompts`` holds a list of (role, content) pairs or a ``_Drop`` per row
        (``_flat_prompts``, ``_turn_list_prompts``). The same checks in the same order with
        the same drop details, the key ``dedupe_key`` gives and the bytes ``encode_record``
        gives, without a row dict, RawTurns or message dicts per row (tests compare the two
        paths).
        """
        kind, source, funnel = self.kind, self.source, self.funnel
        assert kind is not None
        raw_ids = batch.column(kind.id_column) if kind.id_column else None
        langs = batch.column(kind.language_column) if self.languages is not None else None
        labels = batch.column(kind.source_column) if self.excluded else None
        meta = _ColumnMetadata(kind, source, batch)
        languages, excluded = self.languages, self.excluded
        prefix, seen_ids = self.id_prefix, self.seen_ids
        funnel.read += len(prompts)
        pending: list[tuple[str, list[tuple[str, str]], int]] = []  # row id, turns, row offset
        for offset, prompt in enumerate(prompts):
            index = batch.start + offset
            rid = _row_id(prefix, raw_ids[offset] if raw_ids is not None else None, index,
                          seen_ids if raw_ids is not None else None)
            if type(prompt) is _Drop:
                funnel.drop(prompt.reason, rid, prompt.detail)
                continue
            if langs is not None and langs[offset] not in languages:  # type: ignore[operator]
                funnel.drop("filtered_language", rid, str(langs[offset]))
                continue
            if labels is not None and labels[offset] in excluded:
                funnel.drop("filtered_source", rid, str(labels[offset]))
                continue
            pending.append((rid, prompt, offset))
        if self.unit == "characters":
            lengths: Any = [sum(len(c) for _, c in turns) for _, turns, _ in pending]
        else:
            lengths = self.count_lengths(
                [[{"role": r, "content": c} for r, c in turns] for _, turns, _ in pending]
            )
        keys: list[bytes] = []
        lines: list[bytes] = []
        tail = f',"source":{_encode_str(source.name)}}}\n'
        shortest, longest = self.settings.min_prompt_length, self.settings.max_prompt_length
        for (rid, turns, offset), length in zip(pending, lengths, strict=True):
            if length < shortest or (longest is not None and length > longest):
                self._length_ok(rid, length)  # counts the drop
                continue
            if len(turns) == 1:
                role, content = turns[0]
                text = role + "\x1f" + _fold(content)
                messages = '{"content":' + _encode_str(content) + ',"role":"' + role + '"}'
            else:
                text = "\x1e".join([r + "\x1f" + _fold(c) for r, c in turns])
                messages = ",".join(
                    ['{"content":' + _encode_str(c) + ',"role":"' + r + '"}' for r, c in turns]
                )
            keys.append(_blake2b(text.encode("utf-8"), digest_size=16).digest())
            lines.append(
                (
                    '{"id":'
                    + _encode_str(rid)
                    + ',"messages":['
                    + messages
                    + '],"metadata":'
                    + meta.json[offset]
                    + tail
                ).encode("utf-8")
            )
        return keys, lines

    def flat_columns(self, batch: RowBatch) -> tuple[list[bytes], list[bytes]]:
        """Return what ``columns`` returns for a flat layout with lengths in characters.

        One pass per row and no per-row containers: the commonest case (most rows of the
        usual sources), so written out whole. Drops come in row order per reason, as there.
        """
        kind, source, funnel = self.kind, self.source, self.funnel
        assert kind is not None and kind.text_column is not None
        texts = batch.column(kind.text_column)
        raw_ids = batch.column(kind.id_column) if kind.id_column else None
        labels = batch.column(kind.source_column) if self.excluded else None
        metadata = _ColumnMetadata(kind, source, batch).json
        excluded, prefix, seen_ids = self.excluded, self.id_prefix, self.seen_ids
        shortest, longest = self.settings.min_prompt_length, self.settings.max_prompt_length
        head, tail = ',"messages":[{"content":', f',"source":{_encode_str(source.name)}}}\n'
        funnel.read += len(texts)
        keys: list[bytes] = []
        lines: list[bytes] = []
        for offset, text in enumerate(texts):
            index = batch.start + offset
            rid = _row_id(prefix, raw_ids[offset] if raw_ids is not None else None, index,
                          seen_ids if raw_ids is not None else None)
            if type(text) is not str:
                drop = _flat_prompts(kind, [text])[0]
                funnel.drop(drop.reason, rid, drop.detail)
                continue
            if not text.strip():
                funnel.drop("empty", rid, EMPTY_DETAIL)
                continue
            if not text.isascii() and not _encodable(text):
                funnel.drop("malformed", rid, INVALID_UNICODE_DETAIL)
                continue
            if labels is not None and labels[offset] in excluded:
                funnel.drop("filtered_source", rid, str(labels[offset]))
                continue
            length = len(text)
            if length < shortest or (longest is not None and length > longest):
                self._length_ok(rid, length)  # counts the drop
                continue
            keys.append(
                _blake2b(("user\x1f" + _fold(text)).encode("utf-8"), digest_size=16).digest()
            )
            lines.append(
                (
                    '{"id":'
                    + _encode_str(rid)
                    + head
                    + _encode_str(text)
                    + ',"role":"user"}],"metadata":'
                    + metadata[offset]
                    + tail
                ).encode("utf-8")
            )
        return keys, lines

    def _length_ok(self, rid: str, length: int) -> bool:
        if length < self.settings.min_prompt_length:
            self.funnel.drop("too_short", rid, str(length))
            return False
        if self.settings.max_prompt_length is not None and length > self.settings.max_prompt_length:
            self.funnel.drop("too_long", rid, str(length))
            return False
        return True


class _ColumnMetadata:
    """The ``metadata`` JSON of each row of a batch, as ``encode_record`` writes it."""

    def __init__(self, kind: Kind, source: SourceSettings, batch: RowBatch) -> None:
        fixed = {"source_kind": kind.name}
        if source.config:
            fixed["config"] = source.config
        n = len(batch)
        # One JSON fragment per row and key, column by column, in sorted key order (as
        # encode_record sorts keys); "" where the row holds None (_metadata leaves it out).
        columns: list[Iterable[str]] = []
        for key in sorted({*fixed, *kind.metadata_columns}):
            name = _encode_str(key) + ":"
            if key in fixed:
                columns.append(repeat(name + _encode_str(fixed[key]), n))
            else:
                columns.append(_fragments(name, batch.column(key)))
        self.json = [
            "{" + ",".join([f for f in row if f]) + "}" for row in zip(*columns, strict=True)
        ]


def _fragments(name: str, values: list[Any]) -> list[str]:
    memo: dict[str, str] = {}  # labels repeat (sources, languages): encode each once
    out = []
    for value in values:
        if value is None:
            out.append("")
        elif type(value) is str:
            fragment = memo.get(value)
            if fragment is None:
                fragment = memo[value] = name + _encode_str(value)
            out.append(fragment)
        elif type(value) is int:  # the encoder writes ints with int.__repr__ too
            out.append(name + repr(value))
        else:
            out.append(name + _encode(value))
    return out


@dataclass(frozen=True, slots=True)
class _Drop:
    """A row the column-wise path drops before its filters, with the row path's details."""

    reason: str
    detail: str


_EMPTY = _Drop("empty", EMPTY_DETAIL)
_INVALID_UNICODE = _Drop("malformed", INVALID_UNICODE_DETAIL)


def _flat_prompts(kind: Kind, texts: list[Any]) -> list[Any]:
    """Return the prompt (one user turn) or drop of each row of a flat layout.

    As ``to_messages(kind.turns(row), policy)`` for any known policy: every policy keeps a
    lone user turn whole.
    """
    column = kind.text_column
    assert column is not None
    out: list[Any] = []
    for text in texts:
        if type(text) is not str:
            try:
                kind.turns({column: text})
            except MalformedRow as exc:  # always: the kind's own message
                out.append(_Drop("malformed", str(exc)))
                continue
            raise AssertionError(f"kind {kind.name} took non-text {text!r} as a prompt")
        if not text.strip():
            out.append(_EMPTY)
        elif not text.isascii() and not _encodable(text):
            out.append(_INVALID_UNICODE)
        else:
            out.append([("user", text)])
    return out


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _turn_list_prompts(
    table: Any, turn_list: tuple[str, str, str], policy: str
) -> list[Any] | None:
    """Return the prompt turns or drop of each row whose turns are a list of objects.

    As ``to_messages(kind.turns(row), policy)``, read from the flattened Arrow list instead
    of a dict per turn. None (take the row path) unless every row holds a list of objects
    with string role and content and no loss flags: the checks for anything else stay in
    one place, ``schemas._turn_list``.
    """
    import pyarrow as pa

    column, role_key, content_key = turn_list
    if column not in table.column_names:
        return None
    turns = table.column(column).combine_chunks()
    kind_of = turns.type
    if not (pa.types.is_list(kind_of) or pa.types.is_large_list(kind_of)):
        return None
    struct = kind_of.value_type
    if not pa.types.is_struct(struct) or struct.get_field_index("loss") != -1:
        return None
    fields = [struct.get_field_index(role_key), struct.get_field_index(content_key)]
    if -1 in fields or any(not pa.types.is_string(struct.field(i).type) for i in fields):
        return None
    flat = turns.flatten()  # the turns of these rows only, also when sliced
    roles_arr, contents_arr = flat.field(fields[0]), flat.field(fields[1])
    if turns.null_count or flat.null_count or roles_arr.null_count or contents_arr.null_count:
        return None
    offsets = turns.offsets.to_pylist()
    base = offsets[0]
    roles = roles_arr.to_pylist()
    contents = contents_arr.to_pylist()
    role_names: dict[str, str | None] = {}
    out: list[Any] = []
    for row in range(len(turns)):
        lo, hi = offsets[row] - base, offsets[row + 1] - base
        mapped = []
        drop = None
        for raw in roles[lo:hi]:
            role = role_names.get(raw, "")
            if role == "":
                role = role_names[raw] = ROLE_NAMES.get(raw.strip().lower())
            if role is None:
                drop = _Drop("unknown_role", f"role {raw!r}")
                break
            mapped.append(role)
        if drop is None:
            drop = _cut(mapped, policy)
        if type(drop) is _Drop:
            out.append(drop)
            continue
        kept = [(mapped[i], contents[lo + i]) for i in drop]
        if not kept[-1][1].strip() or all(not c.strip() for _, c in kept):
            out.append(_EMPTY)
        elif not all(c.isascii() or _encodable(c) for _, c in kept):
            out.append(_INVALID_UNICODE)
        else:
            out.append(kept)
    return out


def _cut(roles: list[str], policy: str) -> Any:
    """Return the indices of the turns a policy keeps (no loss flags), or a ``_Drop``.

    ``turns._many_turns`` on mapped roles.
    """
    users = [i for i, role in enumerate(roles) if role == "user"]
    if not users:
        return _Drop("no_user_turn", f"roles {roles}")
    if policy == "first_user":
        first = users[0]
        return [i for i in range(first) if roles[i] == "system"] + [first]
    if policy == "until_first_trained_assistant":  # no loss flags: the first assistant turn
        cut = roles.index("assistant") if "assistant" in roles else len(roles)
        if not any(r == "user" for r in roles[:cut]):
            return _Drop("no_user_turn", "no user turn before the first trained assistant turn")
        return list(range(cut))
    return list(range(users[-1] + 1))  # until_last_user


def _map_source(
    si: int,
    source: SourceSettings,
    settings: RunSettings,
    unit: str,
    count_lengths: Any,
    directory: str,
) -> _Candidates:
    """Read one source and do every per-row step before dedupe; return its candidates.

    Their JSON lines go to ``directory/NNN.jsonl``. Runs in the stage's process or in its
    worker (``workers.map_in_order``), so it changes no state shared between sources.
    """
    out = _Candidates(SourceFunnel(source.name), str(Path(directory) / f"{si:03d}.jsonl"))
    reader = _SourceReader(source, settings, unit, count_lengths, out)

    def select(columns: list[str], first: dict | None) -> tuple[str, ...]:
        # Resolve the kind before the first batch, so only the columns it reads are loaded.
        return reader.set_kind(columns, first).columns

    size = 0
    with open(out.path, "wb") as fh:
        for batch in iter_batches(source, select=select):
            if reader.kind is None:
                first = next((r for r in batch.rows if MALFORMED_KEY not in r), None)
                reader.set_kind(batch.columns, first)
            keys, lines = reader.batch(batch)
            out.keys += b"".join(keys)
            ends = list(accumulate(map(len, lines), initial=size))  # the batch's start first
            out.ends.extend(ends[1:])
            size = ends[-1]
            fh.write(b"".join(lines))
    if reader.kind is None:
        log.warning("source %s: no rows", source.name)
    return out


def _dedupe(si: int, candidates: _Candidates, existing: KeySet, seen: KeySet) -> _Kept:
    """Drop the candidates seen before (existing sets, earlier rows); return the kept ones.

    The same outcome as taking the candidates one by one in row order: a key in ``existing``
    drops every candidate holding it, as does a key an earlier source kept (``seen``); of
    the rest, the first candidate with a key is kept and later ones are duplicates. The kept
    keys join ``seen``.
    """
    funnel = candidates.funnel
    hi, lo = _halves(candidates.keys)
    in_existing = existing.contains(hi, lo)
    earlier = seen.contains(hi, lo) & ~in_existing
    repeat = _repeats(hi, lo) & ~(in_existing | earlier)
    for reason, mask in (
        ("already_in_existing_set", in_existing),
        ("duplicate_within_source", repeat),
        ("duplicate_across_sources", earlier),
    ):
        dropped = np.flatnonzero(mask)
        if len(dropped):
            funnel.dropped[reason] += len(dropped)
            # Only the few sample ids are read back from the candidates' lines.
            samples = funnel.samples.setdefault(reason, [])
            for c in dropped[: SAMPLE_IDS_PER_REASON - len(samples)].tolist():
                samples.append(candidates.row_id(c))
    chosen = np.flatnonzero(~(in_existing | earlier | repeat))
    seen.add(hi[chosen], lo[chosen])
    funnel.kept = len(chosen)
    ends = np.frombuffer(candidates.ends, dtype=np.int64)
    starts = np.where(chosen > 0, ends[chosen - 1], 0)  # candidate c starts where c - 1 ends
    return _Kept(candidates.path, starts, ends[chosen] - starts)


def _apply_quota(
    source: SourceSettings, funnel: SourceFunnel, n_kept: int, seed: int
) -> Sequence[int]:
    # A range, not a list: no Python int per kept prompt (sample draws the same from both).
    indices = range(n_kept)
    if source.quota is None or source.quota >= n_kept:
        return indices
    rng = random.Random(f"{seed}:{source.name}")
    chosen = sorted(rng.sample(indices, source.quota))
    dropped = n_kept - source.quota
    funnel.dropped["over_quota"] += dropped
    funnel.kept -= dropped
    return chosen


def plan_shards(total: int, shard_size: int) -> int:
    """Return the shard count for ``total`` prompts.

    Any count is prepared: how many shards one run maps is the plan's to check
    (``include/prompts/plan.py``), against the deployment's ``core.max_map_length``.
    """
    return math.ceil(total / shard_size) if total else 0


def prepare_prompts(settings: RunSettings, store: Store | None = None) -> dict[str, Any]:
    """Run the prepare stage and return its manifest (also written to the store).

    Writes ``prompts/shard-NNNNN.jsonl`` and ``prompts/manifest.json`` under the run's
    location, create-only: run again with the same inputs and settings, it rewrites nothing
    and returns the same manifest; with different ones, it fails instead of overwriting.
    """
    with _gc_paused():
        return _prepare(settings, store)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block (as it was before, after it).

    The per-row work allocates millions of short-lived lists and tuples that form no cycles
    (reference counting frees them); the collector's passes over them, ever longer as the
    stage's long-lived containers grow, cost a large share of the time and free nothing.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _prepare(settings: RunSettings, store: Store | None) -> dict[str, Any]:
    store = store or open_store(
        settings.run_uri,
        s3_conn_id=settings.deployment.s3_conn_id,
        protected_prefixes=tuple(settings.deployment.protected_prefixes),
    )
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
    seen_keys = KeySet()
    funnels: list[SourceFunnel] = []
    with tempfile.TemporaryDirectory(prefix="prepare-") as tmp:
        kept: list[_Kept] = []
        selected: list[Sequence[int]] = []
        sources = settings.sources

        def read(si: int) -> _Candidates:
            return _map_source(si, sources[si], settings, unit, count_lengths, tmp)

        sizes = [_source_bytes(source) for source in sources]
        parallel = usable_cpus() >= 2 and sum(sizes) >= PARALLEL_MIN_BYTES
        # The largest sources first: the two processes then end at about the same time.
        claims = sorted(range(len(sources)), key=lambda si: -sizes[si])
        for si, candidates in enumerate(
            map_in_order(len(sources), read, parallel=parallel, claim_order=claims)
        ):
            source, funnel = sources[si], candidates.funnel
            kept.append(_dedupe(si, candidates, existing, seen_keys))
            del candidates  # its keys live on in seen_keys only where kept
            selected.append(_apply_quota(source, funnel, len(kept[si].starts), settings.seed))
            funnel.check()
            funnels.append(funnel)
            log.info(
                "source %s (%s): read %d, kept %d",
                source.name,
                funnel.kind,
                funnel.read,
                funnel.kept,
            )
        del seen_keys

        # (source, kept index) pairs packed in one int each: an array of 8-byte ints instead
        # of a list of tuples; shuffle only swaps items, so the permutation is the same.
        order = array("q")
        for si, chosen in enumerate(selected):
            base = si << 32
            order.extend(
                range(base, base + len(chosen))
                if isinstance(chosen, range)
                else (base | i for i in chosen)
            )
        del selected
        random.Random(settings.seed).shuffle(order)
        n_shards = plan_shards(len(order), settings.shard_size)
        shards = _write_shards(store, kept, order, settings.shard_size, n_shards)

    manifest = {
        "stage": "prepare",
        "preparation_fingerprint": settings.fingerprint(PREPARATION_SETTINGS),
        "preparation_settings": settings.subset(PREPARATION_SETTINGS),
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
    store: Store, kept: list[_Kept], order: array, size: int, n_shards: int
) -> list[dict[str, Any]]:
    """Write the shards in ``order``; return their manifest entries.

    Each shard is stored in a background thread while the next one is read from the
    candidate files and hashed: both sides release the GIL for their long parts (writing and
    fsync; reading and hashing). Lines are read with ``pread``, not through ``mmap``: mapped
    pages would count in the process's resident memory, up to the size of all candidates.
    """
    fds = [os.open(k.path, os.O_RDONLY) for k in kept]
    # Where each prompt in ``order`` lies (file, start, length), found for all at once.
    first = np.cumsum([0] + [len(k.starts) for k in kept])
    codes = np.frombuffer(order, dtype=np.int64)
    flat = first[codes >> 32] + (codes & 0xFFFFFFFF)
    line_file = np.repeat(np.arange(len(kept)), np.diff(first))[flat]
    line_start = np.concatenate([k.starts for k in kept] + [_NO_INTS])[flat]
    line_length = np.concatenate([k.lengths for k in kept] + [_NO_INTS])[flat]
    del codes, flat
    failed = threading.Event()  # as in a plain loop, no shard is written after one failed
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepare-shards") as pool:
            writes: list[Future[dict[str, Any]]] = []
            for n in range(n_shards):
                cut = slice(n * size, (n + 1) * size)
                lines = [
                    os.pread(fds[f], length, s)
                    for f, s, length in zip(
                        line_file[cut].tolist(),
                        line_start[cut].tolist(),
                        line_length[cut].tolist(),
                        strict=True,
                    )
                ]
                if sum(map(len, lines)) != int(line_length[cut].sum()):  # never seen locally
                    raise PrepareError("a spool file was cut short; nothing written")
                if n >= 2:  # at most two shards in memory besides the one being cut
                    writes[n - 2].result()
                data = b"".join(lines)
                entry = {
                    "shard_id": shard_id(n),
                    "key": shard_key(n),
                    "count": len(lines),
                    "sha256": sha256_hex(data),  # here: the thread is the slower side
                    "bytes": len(data),
                }
                writes.append(pool.submit(_write_shard, store, n, data, entry, failed))
            return [w.result() for w in writes]
    finally:
        for fd in fds:
            os.close(fd)


def _write_shard(
    store: Store, n: int, data: bytes, entry: dict[str, Any], failed: threading.Event
) -> dict[str, Any]:
    if failed.is_set():
        raise PrepareError(f"{shard_key(n)} not written: an earlier shard failed")
    try:
        created = store.write_new(shard_key(n), data)
    except BaseException:
        failed.set()
        raise
    if not created:
        log.info("%s already written with identical content; kept", shard_key(n))
    return entry


_NO_INTS = np.empty(0, dtype=np.int64)

#: Below this many bytes of local source files the stage runs in one process: forking a
#: worker costs more than it saves on small inputs (tests set it to 0 to run the worker).
PARALLEL_MIN_BYTES = 64 << 20


def _source_bytes(source: SourceSettings) -> float:
    """Return the size of a source's files: the estimate of its share of the work."""
    if not source.path:
        return math.inf  # a hub download and its rows: large as a rule
    try:
        return sum(os.path.getsize(f) for f in resolve_files(source))
    except (OSError, RuntimeError):
        return 0  # reported by the read itself, in its turn


#: Widest line of the funnel table (a task log viewed at 120 columns).
FUNNEL_WIDTH = 120


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
    # Headers on two lines, split at the underscore nearest their middle, and the columns in
    # blocks (each repeating the source) so that every line fits a 120-column log view.
    heads = [_split_header(h) for h in header]
    lines = [[h[0] for h in heads], [h[1] for h in heads], *rows]
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
    blocks: list[list[int]] = [[]]
    used = widths[0]
    for i in range(1, len(header)):
        if blocks[-1] and used + 2 + widths[i] > FUNNEL_WIDTH:
            blocks.append([])
            used = widths[0]
        blocks[-1].append(i)
        used += 2 + widths[i]
    return "\n\n".join(
        "\n".join(
            "  ".join([r[0].ljust(widths[0]), *(r[i].rjust(widths[i]) for i in block)]).rstrip()
            for r in lines
        )
        for block in blocks
    )


def _split_header(name: str) -> tuple[str, str]:
    cuts = [i for i, ch in enumerate(name) if ch == "_"]
    if not cuts:
        return "", name
    cut = min(cuts, key=lambda i: abs(2 * i - len(name)))
    return name[: cut + 1], name[cut + 1 :]


def read_shard(store: Store, index: int) -> list[dict[str, Any]]:
    """Return the prompt records of shard ``index``."""
    return [json.loads(line) for line in store.read(shard_key(index)).splitlines() if line]


def shard_index(shard: str) -> int:
    """Return the index of a shard id (``shard-00042`` -> 42)."""
    prefix = "shard-"
    if not shard.startswith(prefix) or not shard[len(prefix) :].isdigit():
        raise ValueError(f"not a shard id: {shard!r} (expected e.g. 'shard-00042')")
    return int(shard[len(prefix) :])


def read_shard_by_id(store: Store, shard: str) -> list[dict[str, Any]]:
    """Return the prompt records of the shard named ``shard`` (e.g. ``shard-00042``)."""
    return read_shard(store, shard_index(shard))
