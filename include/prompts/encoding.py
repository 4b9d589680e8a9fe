"""The canonical JSON line of a prompt record: one byte sequence per record, on every path.

The stdlib's public encoder, not msgspec (installed with Airflow) or orjson: neither writes
the same bytes for every value a source's metadata column can hold. msgspec writes ``1e16``
where ``json`` writes ``1e+16``, ``null`` for NaN and infinities, base64 for bytes, and refuses
non-string keys with sorted keys; a different encoder would change existing outputs.
"""

from __future__ import annotations

import json
from typing import Any

from include.jsonl import escape_breaks

# One encoder made once; records come from parsed data, so they cannot be circular.
_ENCODER = json.JSONEncoder(
    ensure_ascii=False,
    check_circular=False,
    allow_nan=False,  # NaN and infinities are no JSON: a row holding one is dropped
    sort_keys=True,
    separators=(",", ":"),
    default=str,
)


def encode_record(record: dict[str, Any]) -> bytes:
    """Return the one canonical JSON line for a record (sorted keys: byte-stable output).

    ``json.dumps(record, ensure_ascii=False, sort_keys=True, separators=(",", ":"),
    default=str, allow_nan=False)``'s bytes, breaks escaped (``include.jsonl``).
    """
    return (escape_breaks(_ENCODER.encode(record)) + "\n").encode("utf-8")


def encode_value(value: Any) -> str:
    """Return ``value`` as encode_record writes it (any JSON value, not only records)."""
    return escape_breaks(_ENCODER.encode(value))


def encode_string(text: str) -> str:
    """Return a string as encode_record writes it."""
    # The encoder escapes only quotes, backslashes and characters below U+0020 (all
    # non-printable); checking for those in C is cheaper than escaping a long prompt.
    if text.isprintable() and '"' not in text and "\\" not in text:
        return '"' + text + '"'
    return escape_breaks(_ENCODER.encode(text))


def _utf8_line(line: str) -> bytes | None:
    try:
        return line.encode("utf-8")
    except UnicodeEncodeError:
        return None


def _json_value(value: Any) -> bytes | None:
    try:
        return _utf8_line(_ENCODER.encode(value))
    except ValueError:  # NaN or an infinity
        return None


def printable_id(text: str) -> str:
    """Return ``text`` with lone surrogates written as escapes, safe to report and store."""
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def invalid_field(rid: str, metadata: dict[str, Any] | None = None) -> str:
    """Return the drop detail of a row whose id or a metadata value cannot be written.

    Message text is checked before (``INVALID_UNICODE_DETAIL``); a row parsed from JSON may
    still hold a lone surrogate (``"\\ud800"``) in its id or a metadata column, and a
    metadata column NaN or an infinity, which JSON cannot hold.
    """
    if _utf8_line(rid) is None:
        return "the row id holds invalid unicode (lone surrogates)"
    for key, value in sorted((metadata or {}).items()):
        if _json_value(value) is None or _utf8_line(str(key)) is None:
            return metadata_detail(str(key))
    return "a metadata column holds a value JSON cannot hold"


def metadata_detail(column: str) -> str:
    """Return the drop detail of a row whose metadata column ``column`` cannot be written."""
    return (f"metadata column {printable_id(column)!r} holds invalid unicode (lone "
            "surrogates), NaN or an infinity")
