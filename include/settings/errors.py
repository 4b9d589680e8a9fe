"""Turn a wrong setting into one sentence: the setting, the value it got, what is accepted."""

from __future__ import annotations

import difflib
import re
import textwrap
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError


class SettingsError(ValueError):
    """A setting is wrong; the message names it, the value it got and what it accepts.

    ``problems`` holds each wrong setting's sentence (one, unless ``raise_all`` found more).
    """

    def __init__(self, message: str, problems: Iterable[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems) if problems is not None else [message]


class TaskRefused(SystemExit):
    """A task refuses to go on (a wrong setting, a failed quality gate); ``code`` is the
    reason, one short line.

    A ``SystemExit`` because that is the one exception Airflow's task runner logs as one line
    (``Task exited`` and its code) instead of under 13-15 frames of its own code; the DAG's
    retry policy fails it at once (``include.pipeline.refusal``). Here, not in the pipeline,
    so that the DAG file names it without importing the pipeline when it is parsed.
    """


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """Return `` (did you mean `x`?)`` for the closest known name, or ``""``."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_ACCEPTED = {
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "missing": "a value (this setting is required)",
}


def _accepted(err: dict[str, Any], accepted_patterns: dict[str, str]) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind in _ACCEPTED:
        return _ACCEPTED[kind]
    if kind == "greater_than_equal":
        return f">= {ctx['ge']}"
    if kind == "less_than_equal":
        return f"<= {ctx['le']}"
    if kind == "greater_than":
        return f"> {ctx['gt']}"
    if kind == "literal_error":
        return "one of " + ctx.get("expected", "")
    if kind == "string_pattern_mismatch":
        field = str(err["loc"][-1]) if err["loc"] else ""
        return accepted_patterns.get(field, f"text matching {ctx.get('pattern')}")
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return err["msg"]


def describe(
    exc: ValidationError,
    *,
    what: str = "setting",
    known: Iterable[str] = (),
    accepted_patterns: dict[str, str] | None = None,
    where_configured: Any = None,
) -> list[str]:
    """Return one sentence per error in ``exc``, each naming the setting, value and accepted."""
    known = list(known)
    lines = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        name = _where(loc)
        where = where_configured(str(loc[0])) if where_configured and loc else ""
        if err["type"] == "extra_forbidden":
            hint = did_you_mean(str(loc[-1]), known if len(loc) == 1 else ())
            lines.append(f"unknown {what} `{name}`{hint}{where}")
            continue
        value = err.get("input")
        if err["type"] == "value_error":
            text = _accepted(err, {})
            lines.append(f"{what} `{name}`: {text}{where}" if name else text + where)
            continue
        lines.append(
            f"{what} `{name}`: got {value!r}; accepted: "
            f"{_accepted(err, accepted_patterns or {})}{where}"
        )
    return lines


def raise_all(problems: list[str]) -> None:
    """Raise one SettingsError listing every problem, if there is any."""
    if len(problems) == 1:
        raise SettingsError(problems[0])
    if problems:
        raise SettingsError(
            f"{len(problems)} settings are wrong:\n" + "\n".join(f"  - {p}" for p in problems),
            problems)


#: Columns of a refusal's log lines: they fit a log viewer's width without scrolling sideways.
LINE_WIDTH = 88
_NAMED = re.compile(r"`([^`]+)`")


def refused_names(problems: Iterable[str]) -> list[str]:
    """Return the settings the problems name (each one's first `name`), in order, once each."""
    names = [m[1] for p in problems if (m := _NAMED.search(p))]
    return list(dict.fromkeys(names))


def refusal_summary(problems: list[str]) -> str:
    """Return one short line: how many settings are wrong and which (for a task's failure)."""
    names = refused_names(problems)
    count = f"{len(problems)} setting{'s' * (len(problems) != 1)}"
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return f"{count} refused{': ' + shown if shown else ''} (the reasons are in this task's log)"


def refusal_lines(problems: list[str], width: int = LINE_WIDTH) -> list[str]:
    """Return the problems as short lines: each numbered, wrapped at ``width`` columns."""
    lines = [f"{len(problems)} setting{'s' * (len(problems) != 1)} refused:"]
    for i, text in enumerate(problems, 1):
        head = f"{i}. "
        for part in text.splitlines() or [""]:
            lines += textwrap.wrap(part, width, initial_indent=head,
                                   subsequent_indent=" " * len(head),
                                   break_on_hyphens=False, break_long_words=False) or [head]
            head = " " * len(head)
    return lines
