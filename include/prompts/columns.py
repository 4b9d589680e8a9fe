"""The column-wise paths: a batch's columns in, the reference row path's keys and lines out.

Most rows of the usual sources are a flat text column or a list of turn objects. For those
layouts these paths read the Arrow columns directly, without a row dict, RawTurns or message
dicts per row, and must give the same keys, JSON lines and funnel, byte for byte, as
``rows.read_rows`` (tests compare the two). ``sources.read_batch`` picks the path.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from hashlib import blake2b as _blake2b
from itertools import repeat
from typing import Any

from include.prompts.control import CONTROL_TOKEN, ControlTokens
from include.prompts.encoding import encode_string, encode_value, metadata_detail
from include.prompts.readers import RowBatch
from include.prompts.rows import SourceState, row_id
from include.prompts.schemas import ROLE_NAMES, Kind, MalformedRow
from include.prompts.turns import (
    EMPTY_DETAIL,
    EMPTY_TURN_DETAIL,
    INVALID_UNICODE_DETAIL,
    _fold,
    blank,
)
from include.settings import SourceSettings


def read_columns(
    state: SourceState, batch: RowBatch, prompts: list[Any]
) -> tuple[list[bytes], list[bytes]]:
    """Return what ``rows.read_rows`` returns for a batch, given each row's prompt turns or drop.

    ``prompts`` holds a list of (role, content) pairs or a ``Drop`` per row
    (``flat_prompts``, ``turn_list_prompts``). The same checks in the same order with
    the same drop details, the key ``dedupe_key`` gives and the bytes ``encode_record``
    gives, without a row dict, RawTurns or message dicts per row (tests compare the two
    paths).
    """
    kind, source, funnel = state.kind, state.source, state.funnel
    assert kind is not None
    raw_ids = batch.column(kind.id_column) if kind.id_column else None
    langs = batch.column(kind.language_column) if state.languages is not None else None
    labels = batch.column(kind.source_column) if state.excluded else None
    meta = ColumnMetadata(kind, source, batch)
    languages, excluded = state.languages, state.excluded
    prefix, seen_ids = state.id_prefix, state.seen_ids
    funnel.read += len(prompts)
    pending: list[tuple[str, list[tuple[str, str]], int]] = []  # row id, turns, row offset
    for offset, prompt in enumerate(prompts):
        index = batch.start + offset
        rid = row_id(prefix, raw_ids[offset] if raw_ids is not None else None, index,
                      seen_ids if raw_ids is not None else None)
        if type(prompt) is Drop:
            funnel.drop(prompt.reason, rid, prompt.detail)
            continue
        if langs is not None and langs[offset] not in languages:  # type: ignore[operator]
            funnel.drop("filtered_language", rid, str(langs[offset]))
            continue
        if labels is not None and labels[offset] in excluded:
            funnel.drop("filtered_source", rid, str(labels[offset]))
            continue
        pending.append((rid, prompt, offset))
    if state.unit == "characters":
        lengths: Any = [sum(len(c) for _, c in turns) for _, turns, _ in pending]
    else:
        lengths = state.count_lengths(
            [[{"role": r, "content": c} for r, c in turns] for _, turns, _ in pending]
        )
    keys: list[bytes] = []
    lines: list[bytes] = []
    tail = f',"source":{encode_string(source.name)}}}\n'
    shortest, longest = state.settings.min_prompt_length, state.settings.max_prompt_length
    for (rid, turns, offset), length in zip(pending, lengths, strict=True):
        if length < shortest or (longest is not None and length > longest):
            state.length_ok(rid, length)  # counts the drop
            continue
        row_meta = meta.json[offset]
        if row_meta is None:
            funnel.drop("malformed", rid, meta.detail[offset])
            continue
        if len(turns) == 1:
            role, content = turns[0]
            text = role + "\x1f" + _fold(content)
            messages = '{"content":' + encode_string(content) + ',"role":"' + role + '"}'
        else:
            text = "\x1e".join([r + "\x1f" + _fold(c) for r, c in turns])
            messages = ",".join(
                ['{"content":' + encode_string(c) + ',"role":"' + r + '"}' for r, c in turns]
            )
        keys.append(_blake2b(text.encode("utf-8"), digest_size=16).digest())
        # Arrow holds valid UTF-8 only: no id or metadata value here can hold a lone surrogate
        # (rows parsed from JSON can: rows.read_rows checks them).
        lines.append(('{"id":' + encode_string(rid) + ',"messages":[' + messages
                      + '],"metadata":' + row_meta + tail).encode("utf-8"))
    return keys, lines


def read_flat_columns(state: SourceState, batch: RowBatch) -> tuple[list[bytes], list[bytes]]:
    """Return what ``read_columns`` returns for a flat layout with lengths in characters.

    One pass per row and no per-row containers: the commonest case (most rows of the
    usual sources), so written out whole. Drops come in row order per reason, as there.
    """
    kind, source, funnel = state.kind, state.source, state.funnel
    assert kind is not None and kind.text_column is not None
    texts = batch.column(kind.text_column)
    raw_ids = batch.column(kind.id_column) if kind.id_column else None
    labels = batch.column(kind.source_column) if state.excluded else None
    meta = ColumnMetadata(kind, source, batch)
    metadata = meta.json
    excluded, prefix, seen_ids = state.excluded, state.id_prefix, state.seen_ids
    control = state.control
    shortest, longest = state.settings.min_prompt_length, state.settings.max_prompt_length
    head, tail = ',"messages":[{"content":', f',"source":{encode_string(source.name)}}}\n'
    funnel.read += len(texts)
    keys: list[bytes] = []
    lines: list[bytes] = []
    for offset, text in enumerate(texts):
        index = batch.start + offset
        rid = row_id(prefix, raw_ids[offset] if raw_ids is not None else None, index,
                      seen_ids if raw_ids is not None else None)
        if type(text) is not str:
            drop = flat_prompts(kind, [text])[0]  # non-text: dropped before any check
            funnel.drop(drop.reason, rid, drop.detail)
            continue
        if blank(text):
            funnel.drop("empty", rid, EMPTY_DETAIL)
            continue
        if not text.isascii() and not encodable(text):
            funnel.drop("malformed", rid, INVALID_UNICODE_DETAIL)
            continue
        forged = control.check([("user", text)]) if control is not None else None
        if forged is not None:
            funnel.drop(CONTROL_TOKEN, rid, forged)
            continue
        if labels is not None and labels[offset] in excluded:
            funnel.drop("filtered_source", rid, str(labels[offset]))
            continue
        length = len(text)
        if length < shortest or (longest is not None and length > longest):
            state.length_ok(rid, length)  # counts the drop
            continue
        row_meta = metadata[offset]
        if row_meta is None:
            funnel.drop("malformed", rid, meta.detail[offset])
            continue
        keys.append(
            _blake2b(("user\x1f" + _fold(text)).encode("utf-8"), digest_size=16).digest()
        )
        lines.append((
            '{"id":' + encode_string(rid) + head + encode_string(text)
            + ',"role":"user"}],"metadata":' + row_meta + tail
        ).encode("utf-8"))
    return keys, lines


class ColumnMetadata:
    """The ``metadata`` JSON of each row of a batch, as ``encode_record`` writes it.

    None for a row whose value JSON cannot hold (NaN, an infinity); ``detail`` names it, as
    ``encoding.invalid_field`` does on the row path.
    """

    def __init__(self, kind: Kind, source: SourceSettings, batch: RowBatch) -> None:
        fixed = {"source_kind": kind.name}
        if source.config:
            fixed["config"] = source.config
        n = len(batch)
        # One JSON fragment per row and key, column by column, in sorted key order (as
        # encode_record sorts keys); "" where the row holds None (rows.metadata leaves it out).
        keys = sorted({*fixed, *kind.metadata_columns})
        columns: list[Iterable[str | None]] = []
        for key in keys:
            name = encode_string(key) + ":"
            if key in fixed:
                columns.append(repeat(name + encode_string(fixed[key]), n))
            else:
                columns.append(fragments(name, batch.column(key)))
        self.json: list[str | None] = []
        self.detail: dict[int, str] = {}
        for offset, row in enumerate(zip(*columns, strict=True)):
            if None in row:
                self.json.append(None)
                self.detail[offset] = metadata_detail(keys[row.index(None)])
            else:
                self.json.append("{" + ",".join([f for f in row if f]) + "}")


def fragments(name: str, values: list[Any]) -> list[str | None]:
    """Return the ``"name":value`` fragment of each value of a metadata column.

    "" for None (left out), None for a value JSON cannot hold.
    """
    memo: dict[str, str] = {}  # labels repeat (sources, languages): encode each once
    out: list[str | None] = []
    for value in values:
        if value is None:
            out.append("")
        elif type(value) is str:
            fragment = memo.get(value)
            if fragment is None:
                fragment = memo[value] = name + encode_string(value)
            out.append(fragment)
        elif type(value) is int:  # the encoder writes ints with int.__repr__ too
            out.append(name + repr(value))
        else:
            try:
                out.append(name + encode_value(value))
            except ValueError:  # NaN or an infinity, at any depth
                out.append(None)
    return out


@dataclass(frozen=True, slots=True)
class Drop:
    """A row the column-wise path drops before its filters, with the row path's details."""

    reason: str
    detail: str


EMPTY = Drop("empty", EMPTY_DETAIL)
EMPTY_TURN = Drop("empty", EMPTY_TURN_DETAIL)
INVALID_UNICODE = Drop("malformed", INVALID_UNICODE_DETAIL)


def flat_prompts(kind: Kind, texts: list[Any], control: ControlTokens | None = None) -> list[Any]:
    """Return the prompt (one user turn) or drop of each row of a flat layout.

    As ``to_messages(kind.turns(row), policy)`` for any known policy (every policy keeps a
    lone user turn whole), then ``control``'s check, as ``rows.read_rows``.
    """
    column = kind.text_column
    assert column is not None
    out: list[Any] = []
    for text in texts:
        if type(text) is not str:
            try:
                kind.turns({column: text})
            except MalformedRow as exc:  # always: the kind's own message
                out.append(Drop("malformed", str(exc)))
                continue
            raise AssertionError(f"kind {kind.name} took non-text {text!r} as a prompt")
        if blank(text):
            out.append(EMPTY)
        elif not text.isascii() and not encodable(text):
            out.append(INVALID_UNICODE)
        else:
            out.append(_checked(control, [("user", text)]))
    return out


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def turn_list_prompts(
    table: Any, turn_list: tuple[str, str, str], policy: str, control: ControlTokens | None = None
) -> list[Any] | None:
    """Return the prompt turns or drop of each row whose turns are a list of objects.

    As ``to_messages(kind.turns(row), policy)`` then ``control``'s check, read from the
    flattened Arrow list instead of a dict per turn. None (take the row path) unless every
    row holds a list of objects with string role and content and no loss flags: the checks
    for anything else stay in one place, ``schemas._turn_list``.
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
                drop = Drop("unknown_role", f"role {raw!r}")
                break
            mapped.append(role)
        if drop is None:
            drop = cut_turns(mapped, policy)
        if type(drop) is Drop:
            out.append(drop)
            continue
        kept = [(mapped[i], contents[lo + i]) for i in drop]
        if blank(kept[-1][1]) or all(blank(c) for _, c in kept):
            out.append(EMPTY)
        elif any(r == "user" and blank(c) for r, c in kept):
            out.append(EMPTY_TURN)
        elif not all(c.isascii() or encodable(c) for _, c in kept):
            out.append(INVALID_UNICODE)
        else:
            out.append(_checked(control, kept))
    return out


def _checked(control: ControlTokens | None, turns: list[tuple[str, str]]) -> Any:
    """Return ``turns``, or their ``Drop`` when one holds a control token it may not."""
    forged = control.check(turns) if control is not None else None
    return turns if forged is None else Drop(CONTROL_TOKEN, forged)


def cut_turns(roles: list[str], policy: str) -> Any:
    """Return the indices of the turns a policy keeps (no loss flags), or a ``Drop``.

    ``turns._many_turns`` on mapped roles.
    """
    users = [i for i, role in enumerate(roles) if role == "user"]
    if not users:
        return Drop("no_user_turn", f"roles {roles}")
    if policy == "first_user":
        first = users[0]
        return [i for i in range(first) if roles[i] == "system"] + [first]
    if policy == "until_first_trained_assistant":  # no loss flags: the first assistant turn
        cut = roles.index("assistant") if "assistant" in roles else len(roles)
        if not any(r == "user" for r in roles[:cut]):
            return Drop("no_user_turn", "no user turn before the first trained assistant turn")
        return list(range(cut))
    return list(range(users[-1] + 1))  # until_last_user
