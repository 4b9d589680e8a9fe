"""One source's per-row work: its rows in, its candidates (or counted drops) out.

Everything a row goes through before dedupe happens here (kind, ids, turns, filters,
lengths, dedupe key, JSON line), so one source's work can run in another process than the
dedupe: ``map_source`` is the job the stage's worker runs (``include/prompts/workers.py``).
"""

from __future__ import annotations

import logging
from itertools import accumulate
from pathlib import Path

from include.prompts.columns import flat_prompts, read_columns, read_flat_columns, turn_list_prompts
from include.prompts.dedupe import Candidates
from include.prompts.funnel import SourceFunnel
from include.prompts.readers import MALFORMED_KEY, RowBatch, iter_batches, peek
from include.prompts.rows import LengthCounter, SourceState, read_rows
from include.prompts.schemas import KINDS, Kind, check_kind, detect_kind
from include.prompts.turns import POLICIES
from include.settings import RunSettings, SettingsError, SourceSettings
from include.target_tokenizer import count_prompt_tokens, load_tokenizer

log = logging.getLogger(__name__)


def length_counter(settings: RunSettings) -> tuple[str, LengthCounter]:
    """Return the unit of prompt lengths and the function that measures a batch of prompts.

    Tokens of the chat-templated prompt when the run names a tokenizer (as the server
    counts them), else characters.
    """
    if settings.tokenizer_path:
        tok = load_tokenizer(settings.tokenizer_path)
        return "tokens", lambda convs: count_prompt_tokens(tok, convs, settings.enable_thinking)
    return "characters", lambda convs: [sum(len(m["content"]) for m in c) for c in convs]


def resolve_kind(source: SourceSettings, batch_columns: list[str], first: dict | None) -> Kind:
    """Return the source's kind: as set, or detected from its columns and first row."""
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
    check_filters(source, resolve_kind(source, columns, first))


def check_filters(source: SourceSettings, kind: Kind) -> None:
    """Raise if the source's filters need a column its kind does not have."""
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


def set_kind(state: SourceState, columns: list[str], first: dict | None) -> Kind:
    """Resolve the source's kind, check its filters against it, and record it."""
    state.kind = resolve_kind(state.source, columns, first)
    check_filters(state.source, state.kind)
    state.funnel.kind = state.kind.name
    return state.kind


def column_wise(state: SourceState, batch: RowBatch) -> bool:
    """Return whether a batch may take a column-wise path (else it goes row by row)."""
    kind = state.kind
    assert kind is not None
    return (
        batch.table is not None
        and (kind.text_column is not None or kind.turn_list is not None)
        and kind.extra_metadata is None
        and state.source.multi_turn in POLICIES
        and not state.whole  # whole conversations keep every turn: row by row
        and not {"source_kind", "config"} & set(kind.metadata_columns)
    )


def read_batch(state: SourceState, batch: RowBatch) -> tuple[list[bytes], list[bytes]]:
    """Return the keys and JSON lines of a batch's candidates, by the fastest exact path."""
    kind = state.kind
    assert kind is not None
    if column_wise(state, batch):
        if kind.text_column is not None:
            if state.unit == "characters" and state.languages is None:
                return read_flat_columns(state, batch)
            return read_columns(state, batch, flat_prompts(kind, batch.column(kind.text_column)))
        assert kind.turn_list is not None
        prompts = turn_list_prompts(batch.table, kind.turn_list, state.source.multi_turn)
        if prompts is not None:
            return read_columns(state, batch, prompts)
    return read_rows(state, batch)


def map_source(settings: RunSettings, directory: str, si: int) -> Candidates:
    """Read source ``si`` and do every per-row step before dedupe; return its candidates.

    Their JSON lines go to ``directory/NNN.jsonl``. Runs in the stage's process or in its
    worker, so it takes only picklable arguments and changes no state shared between sources.
    """
    source = settings.sources[si]
    unit, count_lengths = length_counter(settings)
    out = Candidates(SourceFunnel(source.name), str(Path(directory) / f"{si:03d}.jsonl"))
    state = SourceState(source, settings, unit, count_lengths, out.funnel)

    def select(columns: list[str], first: dict | None) -> tuple[str, ...]:
        # Resolve the kind before the first batch, so only the columns it reads are loaded.
        return set_kind(state, columns, first).columns

    size = 0
    with open(out.path, "wb") as fh:
        for batch in iter_batches(source, select=select):
            if state.kind is None:
                first = next((r for r in batch.rows if MALFORMED_KEY not in r), None)
                set_kind(state, batch.columns, first)
            keys, lines = read_batch(state, batch)
            out.keys += b"".join(keys)
            ends = list(accumulate(map(len, lines), initial=size))  # the batch's start first
            out.ends.extend(ends[1:])
            size = ends[-1]
            fh.write(b"".join(lines))
    if state.kind is None:
        log.warning("source %s: no rows", source.name)
    return out
