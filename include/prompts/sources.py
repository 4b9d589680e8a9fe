"""One source's per-row work: its rows in, its candidates (or counted drops) out.

Everything a row goes through before dedupe happens here (kind, ids, turns, filters,
lengths, dedupe key, JSON line), so one source's work can run in another process than the
dedupe: ``map_source`` is the job the stage's worker runs (``include/prompts/workers.py``).
"""

from __future__ import annotations

import functools
import logging
from itertools import accumulate
from pathlib import Path

from include.prompts.columns import flat_prompts, read_columns, read_flat_columns, turn_list_prompts
from include.prompts.control import ControlTokens
from include.prompts.dedupe import Candidates
from include.prompts.errors import PrepareError
from include.prompts.funnel import SourceFunnel
from include.prompts.readers import MALFORMED_KEY, RowBatch, iter_batches, peek
from include.prompts.rows import LengthCounter, SourceState, read_rows
from include.prompts.schemas import KINDS, Kind, check_kind, detect_kind
from include.prompts.turns import POLICIES
from include.settings import RunSettings, SettingsError, SourceSettings
from include.target_tokenizer import TokenizerError, count_prompt_tokens, load_tokenizer

log = logging.getLogger(__name__)


def length_counter(settings: RunSettings) -> tuple[str, LengthCounter]:
    """Return the unit of prompt lengths and the function that measures a batch of prompts:
    tokens as the server counts them when the run names a tokenizer, else characters."""
    if settings.tokenizer_path:
        tok = load_tokenizer(settings.tokenizer_path)
        return "tokens", lambda convs: count_prompt_tokens(tok, convs, settings.enable_thinking)
    return "characters", lambda convs: [sum(len(m["content"]) for m in c) for c in convs]


def control_tokens(settings: RunSettings) -> ControlTokens | str:
    """Return the target's control tokens, or why they are unknown (the tokenizer cannot load).

    From ``tokenizer_path``, else the model's own tokenizer (``model_path``), the one the
    tokenize stage reads; on a worker that cannot load it, the rule cannot apply, and the
    manifest and the card say so.
    """
    name = "tokenizer_path" if settings.tokenizer_path else "model_path"
    path = settings.tokenizer_path or settings.model_path
    try:
        return _control_tokens(path)
    except TokenizerError as exc:
        cause = exc.__cause__ or exc
        return f"{name} {path!r} does not load here ({type(cause).__name__})"


@functools.lru_cache(maxsize=4)
def _control_tokens(path: str) -> ControlTokens:
    return ControlTokens.from_tokenizer(load_tokenizer(path))


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
            texts = batch.column(kind.text_column)
            return read_columns(state, batch, flat_prompts(kind, texts, state.control))
        assert kind.turn_list is not None
        prompts = turn_list_prompts(batch.table, kind.turn_list, state.source.multi_turn,
                                    state.control)
        if prompts is not None:
            return read_columns(state, batch, prompts)
    return read_rows(state, batch)


def _read_or_name_the_row(state: SourceState, batch: RowBatch) -> tuple[list[bytes], list[bytes]]:
    """Return ``read_batch``'s result; on an error no rule foresaw, fail naming the row.

    Every value a rule knows is dropped with a reason; anything else is a bug or a value of a
    new kind, and the same input fails the same way: a ``PrepareError`` (the task fails
    without retry) naming the source, the file and the first row that raises on its own.
    """
    try:
        return read_batch(state, batch)
    except (PrepareError, SettingsError):
        raise
    except Exception as exc:  # noqa: BLE001 - named and re-raised below
        row = _first_failing_row(state, batch)
        where = f"file {batch.file}" if batch.file else "the hub dataset"
        raise PrepareError(
            f"source {state.source.name!r}, {where}, row {row} (counted from 0 over the "
            f"source): {type(exc).__name__}: {exc}. No rule of the prepare stage covers this "
            "value; nothing was written. Remove the row or report it with this message."
        ) from exc


def _first_failing_row(state: SourceState, batch: RowBatch) -> str:
    for i in range(len(batch)):
        one = (RowBatch(batch.start + i, batch.columns, table=batch.table.slice(i, 1))
               if batch.table is not None else
               RowBatch(batch.start + i, batch.columns, batch.rows[i : i + 1]))
        try:
            read_batch(state, one)
        except Exception:  # noqa: BLE001 - the one to name
            return str(batch.start + i)
    return f"among {batch.start}-{batch.start + len(batch) - 1}"


def map_source(settings: RunSettings, directory: str, si: int) -> Candidates:
    """Read source ``si`` and do every per-row step before dedupe; return its candidates.

    Their JSON lines go to ``directory/NNN.jsonl``. Runs in the stage's process or in its
    worker, so it takes only picklable arguments and changes no state shared between sources.
    """
    source = settings.sources[si]
    unit, count_lengths = length_counter(settings)
    out = Candidates(SourceFunnel(source.name), str(Path(directory) / f"{si:03d}.jsonl"))
    control = control_tokens(settings)
    state = SourceState(source, settings, unit, count_lengths, out.funnel,
                        control if isinstance(control, ControlTokens) else None)

    def select(columns: list[str], first: dict | None) -> tuple[str, ...]:
        # Resolve the kind before the first batch, so only the columns it reads are loaded.
        return set_kind(state, columns, first).columns

    size = 0
    with open(out.path, "wb") as fh:
        for batch in iter_batches(source, select=select):
            if state.kind is None:
                first = next((r for r in batch.rows if MALFORMED_KEY not in r), None)
                set_kind(state, batch.columns, first)
            keys, lines = _read_or_name_the_row(state, batch)
            out.keys += b"".join(keys)
            ends = list(accumulate(map(len, lines), initial=size))  # the batch's start first
            out.ends.extend(ends[1:])
            size = ends[-1]
            fh.write(b"".join(lines))
    if state.kind is None:
        log.warning("source %s: no rows", source.name)
    return out
