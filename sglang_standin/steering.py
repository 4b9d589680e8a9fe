"""What a request may steer in the stand-in's sampling: ``logit_bias`` and a ``regex``.

SGLang adds ``logit_bias`` to the logits before sampling (``sampling/sampling_batch_info.py``),
so a bias of +100 makes an id certain at every step and -100 makes it impossible; a ``regex``
constrains every sampled token to the expression (``constrained/xgrammar_backend.py``). The
stand-in samples no logits, so it models the cases a test steers with: a bias of magnitude
``CERTAIN`` or more (one certain id; any number of impossible ones) and a regex that is one
literal string. Anything else is refused with a 400 naming what the stand-in does not model,
never silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_standin.errors import VALIDATION, BadRequest

#: The smallest bias the stand-in takes as certain (positive) or impossible (negative).
CERTAIN = 50.0
_METACHARS = frozenset(".^$*+?()[]{}|")


@dataclass(frozen=True)
class Steering:
    """One request's steering: an id sampled at every step, ids never sampled, a literal."""

    forced: int | None = None
    banned: frozenset[int] = frozenset()
    literal: str | None = None


def parse_steering(body: dict[str, Any]) -> Steering:
    """Read ``logit_bias`` and ``regex`` from a request body; raise BadRequest if unmodelled."""
    bias = body.get("logit_bias") or {}
    if not isinstance(bias, dict):
        raise BadRequest("logit_bias: Input should be a valid dictionary", VALIDATION)
    forced: list[int] = []
    banned: set[int] = set()
    for key, value in bias.items():
        try:
            token, weight = int(key), float(value)
        except (TypeError, ValueError):
            raise BadRequest(f"logit_bias: {key!r}: {value!r} is not an id and a number",
                             VALIDATION) from None
        if weight >= CERTAIN:
            forced.append(token)
        elif weight <= -CERTAIN:
            banned.add(token)
        else:
            raise BadRequest(f"the stand-in models logit_bias of +-{CERTAIN:g} or more only "
                             f"(certain or impossible ids), got {weight:g} for {token}",
                             VALIDATION)
    if len(forced) > 1:
        raise BadRequest("the stand-in models one certain id in logit_bias", VALIDATION)
    regex = body.get("regex")
    literal = None
    if regex is not None:
        literal = literal_of(regex) if isinstance(regex, str) else None
        if literal is None:
            raise BadRequest("the stand-in models a regex that is one literal string only",
                             VALIDATION)
    return Steering(forced[0] if forced else None, frozenset(banned), literal)


def literal_of(regex: str) -> str | None:
    """Return the one string ``regex`` matches when it is a literal (escapes allowed), else None."""
    out: list[str] = []
    chars = iter(regex)
    for ch in chars:
        if ch == "\\":
            nxt = next(chars, None)
            if nxt is None or nxt.isalnum():
                return None  # \d, \w, \n...: classes and escapes the stand-in does not model
            out.append(nxt)
        elif ch in _METACHARS:
            return None
        else:
            out.append(ch)
    return "".join(out)
