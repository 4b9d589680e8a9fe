"""The reference row path: one dict per row through the plain forms, and the per-source state.

A row goes through ``Kind.turns``, ``to_messages``, the filters, the length check,
``dedupe_key`` and ``encode_record``, in that order. Every layout can take this path; the
column-wise paths (``include/prompts/columns.py``) must give the same keys, lines and funnel
for the layouts they take (tests compare the two).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from include.prompts.control import CONTROL_TOKEN, ControlTokens
from include.prompts.encoding import encode_record, invalid_field
from include.prompts.funnel import SourceFunnel
from include.prompts.readers import MALFORMED_KEY, RowBatch
from include.prompts.schemas import Kind, MalformedRow
from include.prompts.turns import WHOLE, DropRow, dedupe_key, to_messages
from include.settings import RunSettings, SourceSettings

#: Source kinds whose assistant turns act by ``Act:``/``Action:`` lines, not tool calls.
AGENT_KINDS = frozenset({"agentinstruct", "agent_flan"})

#: Prompt lengths of a batch's conversations (characters or tokens; ``sources.length_counter``).
LengthCounter = Callable[[Sequence[list[dict[str, str]]]], Sequence[int]]


@dataclass
class SourceState:
    """What reading one source carries from batch to batch, on every path.

    ``kind`` is resolved from the first batch (``sources.set_kind``); ``seen_ids`` holds
    every row id given so far (ids must be unique per source).
    """

    source: SourceSettings
    settings: RunSettings
    unit: str
    count_lengths: LengthCounter
    funnel: SourceFunnel
    #: The target's control tokens (``include/prompts/control.py``); None: no tokenizer.
    control: ControlTokens | None = None
    kind: Kind | None = None
    seen_ids: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        source = self.source
        self.languages = set(source.languages) if source.languages is not None else None
        self.excluded = set(source.exclude_sources)
        self.id_prefix = f"{source.name}:{source.config or 'default'}:"
        #: Whole conversations (``turns: all``): every turn kept, the engine regenerates each.
        self.whole = self.settings.source_turns(source) == "all"
        self.policy = WHOLE if self.whole else source.multi_turn

    @property
    def call_format(self) -> str:
        """How the source's assistant turns act: ``<tool_call>`` blocks or agent actions."""
        return "agent_action" if self.kind and self.kind.name in AGENT_KINDS else "tool_call"

    def length_ok(self, rid: str, length: int) -> bool:
        """Return whether a prompt's length is within bounds; count the drop if not."""
        if length < self.settings.min_prompt_length:
            self.funnel.drop("too_short", rid, str(length))
            return False
        if self.settings.max_prompt_length is not None and length > self.settings.max_prompt_length:
            self.funnel.drop("too_long", rid, str(length))
            return False
        return True


def row_id(prefix: str, raw: Any, index: int, seen: set[str] | None) -> str:
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


def metadata(kind: Kind, row: dict, source: SourceSettings) -> dict[str, Any]:
    """Return a row's ``metadata``: its kind, the source's config and the kind's columns."""
    meta: dict[str, Any] = {"source_kind": kind.name}
    if source.config:
        meta["config"] = source.config
    for col in kind.metadata_columns:
        if row.get(col) is not None:
            meta[col] = row[col]
    if kind.extra_metadata:
        meta.update(kind.extra_metadata(row))
    return meta


def read_rows(state: SourceState, batch: RowBatch) -> tuple[list[bytes], list[bytes]]:
    """Return the keys and JSON lines of a batch's candidates (any layout, row by row)."""
    kind, source, funnel = state.kind, state.source, state.funnel
    assert kind is not None
    pending: list[tuple[str, list[dict[str, str]], dict[str, Any]]] = []
    for offset, row in enumerate(batch.rows):
        index = batch.start + offset
        funnel.read += 1
        if MALFORMED_KEY in row:
            funnel.drop("malformed", f"{state.id_prefix}{index}", row[MALFORMED_KEY])
            continue
        rid = row_id(state.id_prefix, row.get(kind.id_column) if kind.id_column else None,
                     index, state.seen_ids)
        try:
            messages = to_messages(kind.turns(row), state.policy)
        except MalformedRow as exc:
            funnel.drop("malformed", rid, str(exc))
            continue
        except DropRow as exc:
            funnel.drop(exc.reason, rid, exc.detail)
            continue
        if state.control is not None:
            forged = state.control.check([(m["role"], m["content"]) for m in messages])
            if forged is not None:
                funnel.drop(CONTROL_TOKEN, rid, forged)
                continue
        if state.languages is not None and row.get(kind.language_column) not in state.languages:
            funnel.drop("filtered_language", rid, str(row.get(kind.language_column)))
            continue
        if state.excluded and row.get(kind.source_column) in state.excluded:
            funnel.drop("filtered_source", rid, str(row.get(kind.source_column)))
            continue
        pending.append((rid, messages, metadata(kind, row, source)))
    lengths = state.count_lengths([m for _, m, _ in pending])
    keys: list[bytes] = []
    lines: list[bytes] = []
    for (rid, messages, meta), length in zip(pending, lengths, strict=True):
        if not state.length_ok(rid, length):
            continue
        record = {"id": rid, "source": source.name, "messages": messages, "metadata": meta}
        if state.whole:
            record["turns"] = "all"
            record["call_format"] = state.call_format
        try:
            line = encode_record(record)
        except ValueError:  # the text was checked: an id or a metadata value (NaN, surrogates)
            state.funnel.drop("malformed", rid, invalid_field(rid, meta))
            continue
        keys.append(dedupe_key(messages))
        lines.append(line)
    return keys, lines
