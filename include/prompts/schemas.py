"""The published layouts of the source datasets: how to find the prompt turns in a row.

Each ``Kind`` knows the columns that identify it, how to pull raw turns out of a row, and
which columns carry ids, language, source labels and useful metadata. Facts come from
``shared/docs/datasets.md``; the row-level traps (JSON-string columns, ``"null"`` tools,
mixed role names) are handled here or reported as a malformed row, never raised.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Every role name seen in these datasets, mapped to the chat role it means.
ROLE_NAMES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
}


class MalformedRow(ValueError):
    """A row does not hold what its kind promises (missing field, wrong type, bad JSON)."""


@dataclass(frozen=True)
class RawTurn:
    """One turn as the dataset has it: role name not yet mapped, loss flag if the set has one."""

    role: str
    content: str
    loss: bool | None = None


@dataclass(frozen=True)
class Kind:
    """How one published dataset layout holds its prompt."""

    name: str
    signature: tuple[str, ...]
    turns: Callable[[Mapping[str, Any]], list[RawTurn]]
    id_column: str | None = None
    language_column: str | None = None
    source_column: str | None = None
    metadata_columns: tuple[str, ...] = ()
    extra_metadata: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    detect: Callable[[Sequence[str], Mapping[str, Any] | None], bool] | None = field(
        default=None, repr=False
    )
    #: Columns ``turns`` and ``extra_metadata`` read (the others are named above).
    reads: tuple[str, ...] = ()
    #: Flat layouts: the one column whose text is the whole prompt, a single user turn
    #: (``turns`` gives exactly that, or raises MalformedRow where the value is not text).
    text_column: str | None = None
    #: Layouts whose turns are a list of objects (not a JSON string): the column, the role
    #: key and the content key ``turns`` reads.
    turn_list: tuple[str, str, str] | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column this kind reads from a row; a reader may leave the others out."""
        named = (self.id_column, self.language_column, self.source_column)
        out = [*self.reads, *(c for c in named if c), *self.metadata_columns]
        return tuple(dict.fromkeys(out))


def _text(row: Mapping[str, Any], column: str) -> str:
    value = row.get(column)
    if value is None:
        raise MalformedRow(f"column {column!r} is missing or null")
    if not isinstance(value, str):
        raise MalformedRow(f"column {column!r} holds {type(value).__name__}, not text")
    return value


def _flat(column: str) -> Callable[[Mapping[str, Any]], list[RawTurn]]:
    def turns(row: Mapping[str, Any]) -> list[RawTurn]:
        return [RawTurn("user", _text(row, column))]

    return turns


def _turn_list(
    column: str, role_key: str, content_key: str, *, json_string: bool = False
) -> Callable[[Mapping[str, Any]], list[RawTurn]]:
    def turns(row: Mapping[str, Any]) -> list[RawTurn]:
        value = row.get(column)
        if json_string:
            if not isinstance(value, str):
                raise MalformedRow(
                    f"column {column!r} should be a JSON string, got {type(value).__name__}"
                )
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise MalformedRow(f"column {column!r} is not valid JSON ({exc.msg})") from None
        if not isinstance(value, list):
            raise MalformedRow(
                f"column {column!r} should be a list of turns, got {type(value).__name__}"
            )
        out = []
        for i, turn in enumerate(value):
            if not isinstance(turn, Mapping):
                raise MalformedRow(f"{column}[{i}] is not an object")
            role, content = turn.get(role_key), turn.get(content_key)
            if not isinstance(role, str) or not isinstance(content, str):
                raise MalformedRow(f"{column}[{i}] needs string {role_key!r} and {content_key!r}")
            loss = turn.get("loss")
            out.append(RawTurn(role, content, loss if isinstance(loss, bool) else None))
        return out

    return turns


def _hermes_metadata(row: Mapping[str, Any]) -> dict[str, Any]:
    # `tools` is a JSON string that may be "null" or "[]"; it is metadata only, because the
    # system turn (kept verbatim) is what the model actually sees.
    tools = row.get("tools")
    count = 0
    if isinstance(tools, str) and tools.strip():
        try:
            parsed = json.loads(tools)
            count = len(parsed) if isinstance(parsed, list) else 0
        except json.JSONDecodeError:
            return {"tools_count": None, "tools_unparsable": True}
    elif isinstance(tools, list):
        count = len(tools)
    return {"tools_count": count}


def _first_value(row: Mapping[str, Any] | None, column: str) -> Any:
    return None if row is None else row.get(column)


KINDS: dict[str, Kind] = {
    k.name: k
    for k in [
        Kind(
            "infinity_instruct",
            ("conversations", "langdetect"),
            _turn_list("conversations", "from", "value"),
            turn_list=("conversations", "from", "value"),
            reads=("conversations",),
            id_column="id",
            language_column="langdetect",
            source_column="source",
            metadata_columns=("langdetect", "source", "label"),
        ),
        Kind(
            "webinstructsub",
            ("question", "answer"),
            _flat("question"),
            reads=("question",),
            text_column="question",
            id_column="index",
            source_column="source",
            metadata_columns=("source", "index"),
        ),
        Kind(
            "codefeedback",
            ("query", "answer", "resource"),
            _flat("query"),
            reads=("query",),
            text_column="query",
            source_column="resource",
            metadata_columns=("resource", "lang"),
        ),
        Kind(
            "metamathqa",
            ("query", "response", "type"),
            _flat("query"),
            reads=("query",),
            text_column="query",
            metadata_columns=("type",),
        ),
        Kind(
            "hermes_function_calling",
            ("conversations", "category"),
            _turn_list("conversations", "from", "value"),
            turn_list=("conversations", "from", "value"),
            reads=("conversations", "tools"),
            id_column="id",
            metadata_columns=("category", "subcategory", "task"),
            extra_metadata=_hermes_metadata,
        ),
        Kind(
            "agentinstruct",
            ("conversations",),
            _turn_list("conversations", "from", "value"),
            turn_list=("conversations", "from", "value"),
            reads=("conversations",),
            id_column="id",
            detect=lambda cols, row: (
                isinstance(_first_value(row, "conversations"), list)
                and any(isinstance(t, Mapping) and "loss" in t for t in row["conversations"])
            ),
        ),
        Kind(
            "orca_agentinstruct",
            ("messages",),
            _turn_list("messages", "role", "content", json_string=True),
            reads=("messages",),
            detect=lambda cols, row: isinstance(_first_value(row, "messages"), str),
        ),
        Kind(
            "agent_flan",
            ("conversation",),
            _turn_list("conversation", "role", "content"),
            turn_list=("conversation", "role", "content"),
            reads=("conversation",),
            id_column="id",
        ),
    ]
}

#: Detection order: the most specific signatures first.
_DETECTION_ORDER = (
    "infinity_instruct",
    "hermes_function_calling",
    "agentinstruct",
    "webinstructsub",
    "codefeedback",
    "metamathqa",
    "orca_agentinstruct",
    "agent_flan",
)


class UnknownLayoutError(ValueError):
    """No known kind matches a source's columns."""


def expected_layouts() -> str:
    """Return one line per kind with the columns that identify it."""
    return "; ".join(f"{k.name}: {list(k.signature)}" for k in KINDS.values())


def detect_kind(
    source_name: str, columns: Sequence[str], first_row: Mapping[str, Any] | None
) -> Kind:
    """Return the kind whose signature the columns match; raise UnknownLayoutError if none."""
    cols = set(columns)
    for name in _DETECTION_ORDER:
        kind = KINDS[name]
        if not set(kind.signature) <= cols:
            continue
        if kind.detect is not None and not kind.detect(columns, first_row):
            continue
        return kind
    raise UnknownLayoutError(
        f"source {source_name!r}: cannot recognise its layout from columns {sorted(cols)}. "
        f"Known kinds and the columns they need: {expected_layouts()}. Set `kind` in the "
        "source's settings if the layout is one of these under other column names, or convert "
        "the file."
    )


def check_kind(source_name: str, kind: Kind, columns: Sequence[str]) -> None:
    """Raise UnknownLayoutError if a kind named in the settings lacks its columns."""
    missing = sorted(set(kind.signature) - set(columns))
    if missing:
        raise UnknownLayoutError(
            f"source {source_name!r}: kind {kind.name!r} needs columns {list(kind.signature)} "
            f"but the data lacks {missing} (found {sorted(columns)}). Known kinds: "
            f"{expected_layouts()}"
        )
