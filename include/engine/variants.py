"""Mixed sampling: which sampling variant a prompt gets, the same way on every try.

``sampling_variants`` maps sampling settings to the values to mix, e.g. ``{"temperature":
[0.6, 1.0], "enable_thinking": [true, false]}``. Each setting's value is drawn for each
prompt by its own hash of (seed, setting, prompt id): the settings are crossed (every
combination occurs, each setting's values equally often in expectation, independently of
the others), not zipped (the first temperature is not tied to the first thinking value).
A pure function of the prompt id, so a retry, a resumed shard or a backfill assigns the same
variant; a setting not listed keeps the run's value.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: The sampling settings a variant may set (what reaches the request body, ``client.py``).
VARIANT_KEYS = ("temperature", "top_p", "top_k", "enable_thinking")


def _draw(seed: int, key: str, prompt_id: str, n: int) -> int:
    digest = hashlib.blake2b(f"{seed}\0{key}\0{prompt_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % n


def variant_name(values: Mapping[str, Any]) -> str:
    """Return a variant's name: ``key=value`` pairs in ``VARIANT_KEYS`` order (JSON values)."""
    return ",".join(f"{k}={json.dumps(values[k])}" for k in VARIANT_KEYS if k in values)


def variant_of(prompt_id: str, seed: int, variants: Mapping[str, Sequence[Any]]
               ) -> dict[str, Any]:
    """Return the sampling values ``prompt_id`` gets from ``variants`` ({} when none)."""
    return {key: values[_draw(seed, key, prompt_id, len(values))]
            for key in VARIANT_KEYS if (values := variants.get(key))}


def sampling_for(prompt_id: str, base: Mapping[str, Any], variants: Mapping[str, Sequence[Any]],
                 seed: int) -> dict[str, Any]:
    """Return the sampling a prompt is sent with: ``base``, with its variant's values and
    name (``variant``, which the request body leaves out) when the run mixes sampling."""
    if not variants:
        return dict(base)
    values = variant_of(prompt_id, seed, variants)
    return {**base, **values, "variant": variant_name(values)}


def count_by_thinking(count: Callable[..., Sequence[int]], conversations: Sequence[Any],
                      thinking: Sequence[bool | None], default: bool | None) -> list[int]:
    """Return each conversation's prompt tokens, rendered with its own thinking setting.

    ``count(conversations)`` renders with the run's ``default``; a variant with the other
    value is counted with ``count(conversations, enable_thinking=value)`` (the template
    writes an empty think block when thinking is off, which the server counts).
    """
    thinking = [default if t is None else t for t in thinking]
    if all(t == default for t in thinking):
        return list(count(list(conversations)))
    counts = [0] * len(conversations)
    for value in set(thinking):
        idx = [i for i, t in enumerate(thinking) if t == value]
        convs = [conversations[i] for i in idx]
        got = count(convs) if value == default else count(convs, enable_thinking=value)
        for i, n in zip(idx, got, strict=True):
            counts[i] = n
    return counts
