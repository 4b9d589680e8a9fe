"""Read a source's rows in batches, in bounded memory, from local files or the hub.

Rows come out in batches, in file order, each with its index in the source, so that ids and
"keep the first" dedupe are deterministic. Local files are streamed, so memory does not grow
with their size: parquet a batch at a time, reading only the columns the kind reads; JSON a
few megabytes at a time, a JSON array included (``include/prompts/json_stream.py``). Hub
datasets, and parquet columns ``datasets`` must decode, still go through ``datasets``.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from include.prompts.json_stream import MALFORMED_KEY, JsonReadError, json_parts
from include.settings import SourceSettings

__all__ = ["MALFORMED_KEY", "RowBatch", "SourceReadError", "iter_batches", "peek", "resolve_files"]

_BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json"}


class SourceReadError(RuntimeError):
    """A source cannot be read at all (missing, unreadable, empty); the message says why."""


class RowBatch:
    """Consecutive rows of one source: row ``i`` is source row ``start + i``.

    ``columns`` are the source's columns; rows hold them all, or only those ``select`` chose.
    A batch read into Arrow keeps its rows as a ``table`` and makes Python objects only when
    asked, per column (``column``) or per row (``rows``); a batch parsed row by row (the JSON
    fallback, columns ``datasets`` decodes) holds ``rows`` (some may carry ``MALFORMED_KEY``)
    and no table.
    """

    __slots__ = ("start", "columns", "table", "file", "_rows")

    def __init__(
        self,
        start: int,
        columns: list[str],
        rows: list[dict[str, Any]] | None = None,
        table: Any = None,
        file: str = "",
    ) -> None:
        if (rows is None) == (table is None):
            raise ValueError("a RowBatch holds either rows or an Arrow table")
        self.start = start
        self.file = file  # the local file its rows come from ("" for a hub dataset)
        self.columns = columns
        self.table = table
        self._rows = rows

    def __len__(self) -> int:
        return self.table.num_rows if self._rows is None else len(self._rows)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Return the rows as dicts, made from the table once (``Table.to_pylist`` values)."""
        if self._rows is None:
            names = self.table.column_names
            values = [self.table.column(c).to_pylist() for c in names]
            self._rows = [dict(zip(names, vals, strict=True)) for vals in zip(*values, strict=True)]
        return self._rows

    def column(self, name: str) -> list[Any]:
        """Return one column's values in row order (None where a row lacks it)."""
        if self._rows is None:
            if name in self.table.column_names:
                return self.table.column(name).to_pylist()
            return [None] * self.table.num_rows
        return [row.get(name) for row in self._rows]


#: Called once with the source's columns and its first row, before any batch; returns the
#: columns the rows need (None: all of them). Whatever it raises ends the read.
ColumnSelector = Callable[[list[str], dict[str, Any] | None], Sequence[str] | None]


def resolve_files(source: SourceSettings) -> list[str]:
    """Return the data files a source's ``path`` names (file, directory or glob), sorted."""
    assert source.path is not None
    path = source.path
    if any(ch in path for ch in "*?["):
        files = sorted(glob.glob(path, recursive=True))
    elif os.path.isdir(path):
        files = sorted(
            str(p) for p in Path(path).rglob("*") if p.is_file() and p.suffix in _BUILDERS
        )
    elif os.path.exists(path):
        files = [path]
    else:
        raise SourceReadError(
            f"source {source.name!r}: path {path!r} does not exist. Fix `sources[].path` or "
            "copy the dataset there."
        )
    files = [f for f in files if Path(f).suffix in _BUILDERS]
    if not files:
        raise SourceReadError(
            f"source {source.name!r}: no .parquet, .json or .jsonl files at {path!r}"
        )
    suffixes = {_BUILDERS[Path(f).suffix] for f in files}
    if len(suffixes) > 1:
        raise SourceReadError(
            f"source {source.name!r}: {path!r} mixes parquet and JSON files; give one format "
            "per source"
        )
    return files


def iter_batches(
    source: SourceSettings, batch_size: int = 4096, select: ColumnSelector | None = None
) -> Iterator[RowBatch]:
    """Yield the source's rows in order; raise SourceReadError if it cannot be read.

    With ``select``, rows read into Arrow hold only the columns it returns, so the columns
    nobody reads (answers, mostly) are never turned into Python objects (nor read, from
    parquet). Rows parsed row by row hold every field.
    """
    if not source.path:
        yield from _dataset_batches(_load_hub(source), batch_size, select)
        return
    files = resolve_files(source)
    if _BUILDERS[Path(files[0]).suffix] == "parquet":
        yield from _parquet_batches(source, files, batch_size, select)
    else:
        yield from _json_batches(source, files, batch_size, select)


def _dataset_batches(
    dataset: Any, batch_size: int, select: ColumnSelector | None, columns: list[str] | None = None
) -> Iterator[RowBatch]:
    """Yield the rows of a ``datasets.Dataset`` (``columns``: the source's, if it holds fewer)."""
    wanted = list(dataset.column_names)
    columns = columns or wanted
    if select is not None and len(dataset):
        wanted = _chosen(columns, select(columns, dataset[0]))
        if wanted != columns:
            dataset = dataset.select_columns(wanted)
    start = 0
    if _needs_decoding(dataset, wanted):  # e.g. Json features: only the Python format decodes
        for batch in dataset.iter(batch_size=batch_size):
            values = [batch[c] for c in wanted]
            rows = [dict(zip(wanted, vals, strict=True)) for vals in zip(*values, strict=True)]
            yield RowBatch(start, columns, rows)
            start += len(rows)
        return
    # Arrow slices: no Python objects until the caller asks for a column or the rows.
    for table in dataset.with_format("arrow").iter(batch_size=batch_size):
        yield RowBatch(start, columns, table=table.select(wanted))
        start += table.num_rows


def _needs_decoding(dataset: Any, columns: list[str]) -> bool:
    from datasets.features.features import require_decoding

    features = dataset.features
    return any(require_decoding(features[c]) for c in columns if c in features)


def _chosen(columns: list[str], chosen: Sequence[str] | None) -> list[str]:
    if chosen is None:
        return columns
    keep = set(chosen)
    return [c for c in columns if c in keep] or columns


def _parquet_batches(
    source: SourceSettings, files: list[str], batch_size: int, select: ColumnSelector | None
) -> Iterator[RowBatch]:
    """Yield parquet rows a batch at a time, reading only the chosen columns.

    Every file's batches are cast to the first file's types, as ``datasets`` cast them to the
    features it took from the first file; a file that does not fit fails the source.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        columns, first = _probe_parquet(files)
        schema = pq.read_schema(files[0])
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for one bad file
        raise _parquet_error(source, files, exc) from exc
    if first is None:
        return  # no rows: nothing to choose from, and nothing to read
    wanted = columns if select is None else _chosen(columns, select(columns, first))
    if _hf_decoded(schema, wanted):  # e.g. a Json feature: ``datasets`` turns text to objects
        yield from _dataset_batches(_load_local(files, wanted), batch_size, None, columns)
        return
    target = pa.schema([schema.field(c) for c in wanted])
    start = 0
    for path in files:
        try:
            with pq.ParquetFile(path) as pf:
                for part in pf.iter_batches(batch_size=batch_size, columns=wanted):
                    table = pa.Table.from_batches([part])
                    if not table.schema.equals(target):
                        table = table.cast(target)
                    yield RowBatch(start, columns, table=table, file=path)
                    start += table.num_rows
        except Exception as exc:  # noqa: BLE001 - as above
            raise _parquet_error(source, [path], exc) from exc


def _hf_decoded(schema: Any, columns: list[str]) -> bool:
    """Return whether ``datasets`` would decode one of these columns (its features say so)."""
    if not schema.metadata or b"huggingface" not in schema.metadata:
        return False
    from datasets import Features
    from datasets.features.features import require_decoding

    try:
        features = Features.from_arrow_schema(schema)
    except Exception:  # noqa: BLE001 - metadata datasets cannot read: it would ignore it too
        return False
    return any(require_decoding(features[c]) for c in columns if c in features)


def _parquet_error(source: SourceSettings, files: list[str], exc: Exception) -> SourceReadError:
    return SourceReadError(
        f"source {source.name!r}: cannot read {files} as parquet "
        f"({type(exc).__name__}: {exc}). Check the file is complete and not corrupted."
    )


def _json_batches(
    source: SourceSettings, files: list[str], batch_size: int, select: ColumnSelector | None
) -> Iterator[RowBatch]:
    """Yield the rows of JSON files (each JSON Lines or one array), a part at a time.

    The source's columns are those of its first object; ``select`` is called with them and
    that object before any batch. Rows before it that are no object wait for it, so the first
    batch always comes with the columns. Only tables keep just the chosen columns.
    """
    start = 0
    columns: list[str] | None = None
    wanted: list[str] | None = None  # None: every column
    held: list[dict[str, Any]] = []  # leading rows that are no object
    for path, part in _json_file_parts(source, files):
        if columns is None:
            first = (
                next((r for r in part if MALFORMED_KEY not in r), None)
                if isinstance(part, list)
                else part.slice(0, 1).to_pylist()[0]
            )
            if first is None:
                held += part
                continue
            columns = list(first) if isinstance(part, list) else part.column_names
            if select is not None:
                wanted = _chosen(columns, select(columns, first))
        batches = _row_batches(start, columns, held, batch_size, path)
        held = []
        if isinstance(part, list):  # parsed row by row: every field
            batches += _row_batches(start + sum(map(len, batches)), columns, part, batch_size,
                                    path)
        else:
            if wanted is not None:
                part = part.select([c for c in wanted if c in part.column_names])
            base = start + sum(map(len, batches))
            batches += [
                RowBatch(base + i, columns, table=part.slice(i, batch_size), file=path)
                for i in range(0, part.num_rows, batch_size)
            ]
        yield from batches
        start += sum(map(len, batches))
    yield from _row_batches(start, [], held, batch_size)  # no object at all


def _row_batches(
    start: int, columns: list[str], rows: list[dict[str, Any]], batch_size: int, file: str = ""
) -> list[RowBatch]:
    return [
        RowBatch(start + i, columns, rows[i : i + batch_size], file=file)
        for i in range(0, len(rows), batch_size)
    ]


def _json_file_parts(source: SourceSettings, files: list[str]) -> Iterator[tuple[str, Any]]:
    try:
        for path in files:
            for part in json_parts(path, f"source {source.name}"):
                yield path, part
    except JsonReadError as exc:
        raise SourceReadError(f"source {source.name!r}: {exc}") from None


#: How much of a JSON file ``peek`` reads to find its first row.
_PEEK_BYTES = 4 << 20


def peek(source: SourceSettings) -> tuple[list[str], dict[str, Any] | None]:
    """Return a local source's columns and first row, reading only the start of one file.

    For ``check_settings``: the layout of a source is known in seconds, not after the whole
    prepare stage read it. Raise SourceReadError naming the file when its start is unreadable.
    """
    files = resolve_files(source)
    if _BUILDERS[Path(files[0]).suffix] == "parquet":
        try:
            return _probe_parquet(files)
        except Exception as exc:  # noqa: BLE001 - same message as a failed load
            raise _parquet_error(source, files, exc) from exc
    decoder = json.JSONDecoder()
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(_PEEK_BYTES).lstrip("\ufeff")
        start = len(text) - len(text.lstrip())
        if start == len(text):
            continue  # an empty file: look at the next one
        if text[start] == "[":  # a JSON array: its first element
            start = len(text) - len(text[start + 1:].lstrip())
            if text[start:start + 1] == "]":
                continue
        try:
            row, _ = decoder.raw_decode(text, start)
        except ValueError as exc:
            raise SourceReadError(
                f"source {source.name!r}: {path} does not start with a JSON object ({exc}); "
                "expected JSON Lines or a JSON array of objects") from None
        if not isinstance(row, dict):
            raise SourceReadError(f"source {source.name!r}: the first row of {path} is not a "
                                  "JSON object")
        return list(row), row
    return [], None


def _probe_parquet(files: list[str]) -> tuple[list[str], dict[str, Any] | None]:
    """Return the columns and the first row of parquet files, as ``datasets`` would load them.

    The columns are the first file's schema (where ``datasets`` takes its features from), the
    row the first one of the first file that has rows. Only the first page of each column is
    decoded, not the row group (answers included: a tenth of a second per source).
    """
    import pyarrow.parquet as pq

    with open(files[0], "rb") as fh:
        columns = list(pq.read_schema(fh).names)
    for path in files:
        with pq.ParquetFile(path) as pf:
            for group in range(pf.num_row_groups):
                if pf.metadata.row_group(group).num_rows:
                    first = next(pf.iter_batches(batch_size=1, row_groups=[group]))
                    return columns, first.to_pylist()[0]
    return columns, None


def _load_local(files: list[str], columns: list[str]) -> Any:
    import datasets

    datasets.disable_progress_bars()
    return datasets.load_dataset("parquet", data_files=files, split="train", columns=columns)


def _load_hub(source: SourceSettings) -> Any:
    import datasets

    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(
            source.hub_id, name=source.config, revision=source.revision, split=source.split
        )
    except Exception as exc:  # hub errors come in many types; all need the same message
        raise SourceReadError(
            f"source {source.name!r}: cannot load hub dataset {source.hub_id!r} (config "
            f"{source.config!r}, revision {source.revision!r}, split {source.split!r}): "
            f"{type(exc).__name__}: {exc}. Gated sets need HF_TOKEN; offline workers need a "
            "local `path` instead."
        ) from exc
