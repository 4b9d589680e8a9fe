"""``filter_records``: a shard's completion records in, those kept and those quarantined out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from include.quality.duplicates import near_duplicates
from include.quality.parts import Parts, QualityOptions, parts_of
from include.quality.repetition import degenerate_repetition
from include.quality.structure import empty_answer, invalid_tool_call_json, unclosed_think


def filter_records(
    records: Iterable[Mapping[str, Any]], options: QualityOptions | None = None
) -> tuple[list[Mapping[str, Any]], list[dict[str, str]]]:
    """Return ``(kept, quarantined)``: kept records in their order, and one entry per record
    kept out, ``{"id", "reason", "detail"}`` with the filter's name as its reason.

    Each record meets the filters in ``QUALITY_FILTERS`` order and is quarantined by the
    first that fails; ``near_duplicate`` compares only records every other filter kept.
    Records the filters must not judge (see ``parts_of``) are kept untouched.
    """
    options = options or QualityOptions()
    kept: list[Mapping[str, Any]] = []
    judged: list[tuple[int, Parts]] = []
    quarantined: list[dict[str, str]] = []
    for record in records:
        parts = parts_of(record, options)
        problem = _first_problem(parts, options) if parts is not None else None
        if problem is not None:
            quarantined.append({"id": str(record.get("id", "")), "reason": problem[0],
                                "detail": problem[1]})
            continue
        kept.append(record)
        if parts is not None:
            judged.append((len(kept) - 1, parts))
    if options.on("near_duplicate") and judged:
        repeats = near_duplicates([p for _, p in judged], options)
        drop = {judged[i][0]: detail for i, detail in repeats.items()}
        survivors = []
        for k, record in enumerate(kept):
            if k in drop:
                quarantined.append({"id": str(record.get("id", "")),
                                    "reason": "near_duplicate", "detail": drop[k]})
            else:
                survivors.append(record)
        kept = survivors
    return kept, quarantined


def _first_problem(parts: Parts, options: QualityOptions) -> tuple[str, str] | None:
    checks: Sequence[tuple[str, Any]] = (
        ("degenerate_repetition", lambda: degenerate_repetition(parts, options)),
        ("unclosed_think", lambda: unclosed_think(parts)),
        ("empty_answer", lambda: empty_answer(parts)),
        ("invalid_tool_call_json", lambda: invalid_tool_call_json(parts)),
    )
    for name, check in checks:
        if options.on(name):
            detail = check()
            if detail:
                return name, detail
    return None
