"""Stream the rows of a JSON file, JSON Lines or one top-level array, in bounded memory.

A part of the file at a time becomes an Arrow table through pyarrow's JSON reader (the parser
``datasets`` used, so values and types are those it gave), and a part pyarrow cannot take (rows
that disagree on a column's type, invalid UTF-8, a broken line) is parsed again row by row with
the standard library, so its odd rows reach the funnel as malformed instead of failing the
source. A JSON array (MetaMathQA: one 400 MB document) is read through a sliding window, one
item at a time, instead of being loaded whole.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

#: The key a row gets when it could not be parsed into an object at all.
MALFORMED_KEY = "__malformed__"

#: How much JSON text one part holds (bytes of JSON Lines, characters of an array's items).
PART_SIZE = 8 << 20

_BOM = b"\xef\xbb\xbf"


class JsonReadError(ValueError):
    """A JSON file cannot be read at all; the message names the file, the place and what to do."""


def json_parts(path: str, label: str) -> Iterator[Any]:
    """Yield a JSON file's rows in order, in parts: Arrow tables, or lists of row dicts.

    Rows parsed one by one hold every field; one that is no object is ``{MALFORMED_KEY:
    detail}``. One array (MetaMathQA, Hermes) or JSON Lines (CodeFeedback) are told apart by
    the first character, so either form works whatever the extension says. ``label`` names
    the source in warnings. Raise JsonReadError for an array that is not valid JSON.
    """
    with open(path, "rb") as fh:
        head = fh.read(4096).lstrip(_BOM + b" \t\r\n")
    if head.startswith(b"["):
        yield from _array_parts(path, label)
    else:
        yield from _lines_parts(path, label)


def _lines_parts(path: str, label: str) -> Iterator[Any]:
    lineno = 0  # lines before this part
    warned = False
    with open(path, "rb") as fh:
        while chunk := fh.read(PART_SIZE):
            chunk += fh.readline()  # whole lines only
            if lineno == 0 and chunk.startswith(_BOM):
                chunk = chunk[len(_BOM) :]
            table = None if chunk.isspace() else _arrow(chunk, pretty=False)
            if table is not None:
                yield table
            else:
                rows = _lines_rows(path, chunk, lineno)
                if rows and not warned:
                    warned = _warn(label, path, f"line {lineno + 1}")
                yield rows
            lineno += chunk.count(b"\n")


def _lines_rows(path: str, chunk: bytes, lineno: int) -> list[dict[str, Any]]:
    """Return JSON lines parsed one by one (after ``lineno`` lines); no object: malformed."""
    name = Path(path).name
    rows: list[dict[str, Any]] = []
    text = chunk.decode("utf-8", errors="surrogateescape")
    for n, line in enumerate(text.split("\n"), lineno + 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            rows.append({MALFORMED_KEY: f"{name} line {n}: invalid JSON ({exc.msg})"})
            continue
        rows.append(
            item if isinstance(item, dict) else {MALFORMED_KEY: f"{name} line {n}: not an object"}
        )
    return rows


def _warn(label: str, path: str, where: str) -> bool:
    log.warning(
        "%s: pyarrow cannot parse part of %s (from %s: rows that disagree on a column's type, "
        "invalid UTF-8 or a broken row); such parts are read row by row",
        label,
        path,
        where,
    )
    return True


def _arrow(data: bytes, pretty: bool) -> Any:
    """Return JSON objects (one a line, or ``pretty``: any white space between) as a table.

    None where pyarrow cannot take them. Invalid UTF-8 is refused here (it is known valid where
    ``pretty``: encoded from text): pyarrow would keep it and fail only when a value is read.
    """
    import pyarrow as pa
    import pyarrow.json as paj

    if not pretty and not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        return paj.read_json(
            io.BytesIO(data),
            read_options=paj.ReadOptions(use_threads=False, block_size=len(data) + 1),
            parse_options=paj.ParseOptions(newlines_in_values=pretty),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None


def _array_parts(path: str, label: str) -> Iterator[Any]:
    """Yield the items of one JSON array in parts of about PART_SIZE characters."""
    texts: list[str] = []  # the JSON text of each item of the part (all objects)
    items: list[dict[str, Any]] = []  # the same, parsed: the part's rows if pyarrow fails
    warned = False

    def part(first: int) -> Any:
        nonlocal warned
        try:
            table = _arrow("\n".join(texts).encode("utf-8"), pretty=True)
        except UnicodeEncodeError:  # a lone surrogate: invalid UTF-8 in the file
            table = None
        if table is None and not warned:
            warned = _warn(label, path, f"item {first}")
        return items if table is None else table

    size = first = 0  # characters in the part, index of its first item
    with open(path, encoding="utf-8", errors="surrogateescape", newline="") as fh:
        for index, (item, text) in enumerate(_JsonArray(fh, path)):
            if not isinstance(item, dict):
                if items:
                    yield part(first)
                    texts, items, size = [], [], 0
                kind = type(item).__name__
                yield [{MALFORMED_KEY: f"array item {index} is {kind}, not an object"}]
                continue
            if not items:
                first = index
            texts.append(text)
            items.append(item)
            size += len(text)
            if size >= PART_SIZE:
                yield part(first)
                texts, items, size = [], [], 0
    if items:
        yield part(first)


#: JSON's white space (``str.isspace`` takes more), and what may follow an array's item.
_WHITE = re.compile(r"[ \t\n\r]*")
_FOLLOWS = re.compile(r"[ \t\n\r]*(?:,|(\]))[ \t\n\r]*")


class _JsonArray:
    """The items of the one top-level JSON array of a file, with their JSON text.

    The file is read a window at a time and each item parsed with ``JSONDecoder.raw_decode``
    (exact, in C); an item the window cuts short is parsed again with more of the file in
    view, so memory holds one window (or one item, if longer), not the file.
    """

    def __init__(self, fh: IO[str], path: str) -> None:
        self.fh, self.path = fh, path
        self.buf, self.pos = "", 0
        self.before = 0  # characters of the file before ``buf``
        self.eof = False

    def _more(self) -> bool:
        """Read more of the file into the window (what is before ``pos`` goes)."""
        if self.eof:
            return False
        kept = len(self.buf) - self.pos
        part = self.fh.read(max(PART_SIZE, kept))  # an item longer than the window: it doubles
        if not part:
            self.eof = True
            return False
        self.before += self.pos
        self.buf, self.pos = self.buf[self.pos :] + part, 0
        return True

    def _next(self) -> str:
        """Skip white space; return the next character ('' at the end of the file)."""
        while True:
            self.pos = _WHITE.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                return ""

    def _error(self, what: str, pos: int) -> JsonReadError:
        return JsonReadError(
            f"{self.path} starts as a JSON array but is not valid JSON ({what} at character "
            f"{self.before + pos}). The file may be truncated; download it again."
        )

    def __iter__(self) -> Iterator[tuple[Any, str]]:
        decode = json.JSONDecoder().raw_decode
        self._more()
        if self.buf.startswith("\ufeff"):
            self.pos = 1
        if self._next() != "[":
            raise self._error("no '[' first", self.pos)
        self.pos += 1
        if self._next() == "]":
            self.pos += 1
            self._end()
            return
        while True:
            start = self.pos
            try:
                item, end = decode(self.buf, start)
            except json.JSONDecodeError as exc:
                # Where the window cuts an item short, the error is at its end, or is an
                # unterminated string; anywhere else the file itself is wrong.
                cut = exc.pos >= len(self.buf) - 16 or exc.msg.startswith("Unterminated string")
                if cut and self._more():
                    continue
                raise self._error(exc.msg, exc.pos) from None
            follows = _FOLLOWS.match(self.buf, end)  # up to the next item, or the end
            if follows is None or follows.end() == len(self.buf):
                gap = _WHITE.match(self.buf, end).end()  # type: ignore[union-attr]
                if (follows is not None or gap == len(self.buf)) and self._more():
                    continue  # the window ends there (a number may go on): parse it again
                if follows is None:
                    raise self._error("expected ',' or ']' after an item", gap)
            yield item, self.buf[start:end]
            self.pos = follows.end()
            if follows.group(1):  # the closing ']'
                self._end()
                return

    def _end(self) -> None:
        if self._next():
            raise self._error("extra data after the array", self.pos)
