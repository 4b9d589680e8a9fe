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
    sort_keys=True,
    separators=(",", ":"),
    default=str,
)


def encode_record(record: dict[str, Any]) -> bytes:
    """Return the one canonical JSON line for a record (sorted keys: byte-stable output).

    The same bytes as ``json.dumps(record, ensure_ascii=False, sort_keys=True,
    separators=(",", ":"), default=str) + "\\n"`` in UTF-8, line breaks other than ``\\n``
    escaped (``include.jsonl``).
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
