"""Read a source's rows with the ``datasets`` library, from local files or the hub.

Rows come out in batches, in file order, each with its index in the source, so that ids and
"keep the first" dedupe are deterministic. A file ``datasets`` cannot load because its rows
disagree on a column's type (a JSONL row holding a number where the others hold text) is read
again row by row, so the odd rows reach the funnel as malformed instead of failing the source.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from include.settings import SourceSettings

log = logging.getLogger(__name__)

_BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json"}

#: The key a row gets when the fallback reader could not parse its line at all.
MALFORMED_KEY = "__malformed__"


class SourceReadError(RuntimeError):
    """A source cannot be read at all (missing, unreadable, empty); the message says why."""


class RowBatch:
    """Consecutive rows of one source: row ``i`` is source row ``start + i``.

    ``columns`` are the source's columns; rows hold them all, or only those ``select`` chose.
    A batch read through ``datasets`` keeps its rows as an Arrow ``table`` and makes Python
    objects only when asked, per column (``column``) or per row (``rows``); a batch from the
    row-by-row JSON fallback holds ``rows`` (some may carry ``MALFORMED_KEY``) and no table.
    """

    __slots__ = ("start", "columns", "table", "_rows")

    def __init__(
        self,
        start: int,
        columns: list[str],
        rows: list[dict[str, Any]] | None = None,
        table: Any = None,
    ) -> None:
        if (rows is None) == (table is None):
            raise ValueError("a RowBatch holds either rows or an Arrow table")
        self.start = start
        self.columns = columns
        self.table = table
        self._rows = rows

    def __len__(self) -> int:
        return self.table.num_rows if self._rows is None else len(self._rows)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Return the rows as dicts, made from the table once.

        The values are those ``datasets`` gives in its Python format (``Table.to_pydict``).
        """
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

    With ``select``, rows read through ``datasets`` hold only the columns it returns, so the
    columns nobody reads (answers, mostly) are never turned into Python objects. Rows from the
    row-by-row JSON fallback always hold every field (``select`` is not called there).
    """
    columns: list[str] | None = None  # the source's columns, when known before loading
    wanted: list[str] | None = None
    if source.path:
        files = resolve_files(source)
        builder = _BUILDERS[Path(files[0]).suffix]
        if builder == "parquet" and select is not None:
            # Parquet files are read column by column: choose the columns from the schema
            # and the first row, then load only those (not the answers next to the prompts).
            try:
                columns, first = _probe_parquet(files)
            except Exception as exc:  # same message as a failed load below
                raise _parquet_error(source, files, exc) from exc
            if first is not None:  # else no rows: nothing to choose, as for an empty dataset
                wanted = _chosen(columns, select(columns, first))
            else:
                columns = None
        try:
            dataset = _load_local(builder, files, wanted if wanted != columns else None)
        except SourceReadError:
            raise
        except Exception as exc:  # datasets/pyarrow raise many types for one bad file
            if builder != "json":
                raise _parquet_error(source, files, exc) from exc
            log.warning(
                "source %s: datasets could not load %s (%s: %s); reading it row by row",
                source.name,
                files,
                type(exc).__name__,
                str(exc).splitlines()[0][:200],
            )
            yield from _iter_json_rows(source, files, batch_size)
            return
    else:
        dataset = _load_hub(source)
    if columns is None:
        columns = list(dataset.column_names)
        if select is not None and len(dataset):
            wanted = _chosen(columns, select(columns, dataset[0]))
            if wanted != columns:
                dataset = dataset.select_columns(wanted)
    if wanted is None:
        wanted = columns
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


def _parquet_error(source: SourceSettings, files: list[str], exc: Exception) -> SourceReadError:
    return SourceReadError(
        f"source {source.name!r}: cannot read {files} as parquet "
        f"({type(exc).__name__}: {exc}). Check the file is complete and not corrupted."
    )


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
            text = fh.read(_PEEK_BYTES)
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
    row the first one of the first file that has rows; only one row group is read.
    """
    import pyarrow.parquet as pq

    with open(files[0], "rb") as fh:
        columns = list(pq.read_schema(fh).names)
    for path in files:
        with pq.ParquetFile(path) as pf:
            for group in range(pf.num_row_groups):
                if pf.metadata.row_group(group).num_rows:
                    return columns, pf.read_row_group(group).slice(0, 1).to_pylist()[0]
    return columns, None


def _load_local(builder: str, files: list[str], columns: list[str] | None = None) -> Any:
    import datasets

    datasets.disable_progress_bars()
    if columns is not None:  # parquet only
        return datasets.load_dataset(builder, data_files=files, split="train", columns=columns)
    return datasets.load_dataset(builder, data_files=files, split="train")


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


def _iter_json_rows(
    source: SourceSettings, files: list[str], batch_size: int
) -> Iterator[RowBatch]:
    # One JSON array (MetaMathQA, Hermes) or JSON Lines (CodeFeedback), told apart by the first
    # character, so a file in either form works whatever its extension says.
    start = 0
    columns: list[str] = []
    rows: list[dict[str, Any]] = []
    for path in files:
        for row in _json_file_rows(source, path):
            if not columns and MALFORMED_KEY not in row:
                columns = list(row)
            rows.append(row)
            if len(rows) >= batch_size:
                yield RowBatch(start, columns, rows)
                start += len(rows)
                rows = []
    if rows:
        yield RowBatch(start, columns, rows)


def _json_file_rows(source: SourceSettings, path: str) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
        head = fh.read(4096).lstrip()
        fh.seek(0)
        if head.startswith("["):
            try:
                data = json.load(fh)
            except json.JSONDecodeError as exc:
                raise SourceReadError(
                    f"source {source.name!r}: {path} starts as a JSON array but is not valid "
                    f"JSON ({exc}). The file may be truncated; download it again."
                ) from exc
            for i, item in enumerate(data):
                yield (
                    item
                    if isinstance(item, dict)
                    else {MALFORMED_KEY: f"array item {i} is {type(item).__name__}, not an object"}
                )
            return
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                yield {MALFORMED_KEY: f"{Path(path).name} line {lineno}: invalid JSON ({exc.msg})"}
                continue
            yield (
                item
                if isinstance(item, dict)
                else {MALFORMED_KEY: f"{Path(path).name} line {lineno}: not an object"}
            )
