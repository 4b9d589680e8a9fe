"""JSON lines every reader splits right: the line breaks JSON leaves raw, escaped.

``json`` and msgspec escape control characters below U+0020 but write U+2028, U+2029 and NEL
(U+0085) as they are: valid JSON, yet ``str.splitlines()`` (and readers built on it) breaks a
record there. Every JSONL file a run writes passes its lines through ``escape_breaks``; the
escaped form decodes to the same string, so a JSON reader sees the same record.
"""

from __future__ import annotations

_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})
_BREAK_BYTES = ("\u2028".encode(), "\u2029".encode(), "\x85".encode())


def escape_breaks(line: str) -> str:
    """Return a JSON text with U+2028, U+2029 and U+0085 written as escapes."""
    if "\u2028" in line or "\u2029" in line or "\x85" in line:
        return line.translate(_BREAKS)
    return line


def escape_break_bytes(line: bytes) -> bytes:
    """Return UTF-8 JSON with U+2028, U+2029 and U+0085 written as escapes."""
    if any(b in line for b in _BREAK_BYTES):
        return escape_breaks(line.decode("utf-8")).encode("utf-8")
    return line
