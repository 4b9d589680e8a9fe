"""The report's facts of one shard, written beside its completions when it is published.

The report reads these instead of every completion's text and token ids: at the planned run
(655 shards of 1,000 prompts) the journals are gigabytes of JSON for one task to read at the
run's end, and the facts a few tens of megabytes (issue 28). Per completion only the figures
the report counts, in columns; per failed prompt its attempts. The upload task writes them
(``generated/<shard>.facts.json``, checksummed in the shard's manifest) from the very records
it publishes, which are the records the report read from the journal before; a shard
published before they existed is still read from its journal.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

#: The facts file's format; a reader refuses another (a newer writer's) and reads the journal.
FACTS_VERSION = 1


def source_of(prompt_id: str) -> str:
    """Return the source name of a prompt id (``<source>:<config>:<row>``, see data-layout)."""
    return prompt_id.split(":", 1)[0]


@dataclass(slots=True)
class Completion:
    """The report's view of one completed journal record (slots: a run holds ~655,000)."""

    source: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    server: str
    model: str
    finished_at: float
    latency_s: float
    #: 1 + its retries (a conversation's turns each count one request, not a retry).
    attempts: int
    #: SGLang's version as the record says its server reported it ("" when it does not).
    server_version: str = ""
    #: The weights that answered (``metadata.weight_version``; "" when not reported).
    weight_version: str = ""
    #: The server's count of thinking tokens (``usage.completion_tokens_details``), or None.
    reasoning_tokens: int | None = None
    #: The prompt's id, and its mixed-sampling variant ("" when the run had one sampling).
    prompt_id: str = ""
    variant: str = ""


def _usage(rec: dict[str, Any]) -> dict[str, int]:
    """Return a record's usage; a whole conversation's is the sum of its turns' usage."""
    if rec.get("usage") or not rec.get("turn_results"):
        return rec.get("usage") or {}
    turns = [t.get("usage") or {} for t in rec["turn_results"]]
    return {k: sum(int(u.get(k) or 0) for u in turns)
            for k in ("prompt_tokens", "completion_tokens")}


def _reasoning_tokens(rec: dict[str, Any]) -> int | None:
    """Return the server's reasoning-token count of a record (its turns' sum), or None."""
    usages = ([t.get("usage") or {} for t in rec["turn_results"]] if rec.get("turn_results")
              else [rec.get("usage") or {}])
    # SGLang 0.5.23 counts them always at ``usage.reasoning_tokens`` (the OpenAI place,
    # ``completion_tokens_details``, only when there are some); older releases do not.
    counts = [u.get("reasoning_tokens", (u.get("completion_tokens_details") or {}).get(
        "reasoning_tokens")) for u in usages]
    if any(type(c) is not int for c in counts):
        return None
    return sum(counts)


def _attempts(rec: dict[str, Any], timings: dict[str, Any]) -> int:
    """Return 1 + the retries a record took: a whole conversation's ``attempts`` are its
    turns' sum, and each turn's own first request is no retry (issue 34: "68 extra attempts"
    under ``turns: all`` where every shard log said 0 retries)."""
    turns = len(rec.get("turn_results") or ()) or 1
    return max(int(timings.get("attempts") or 1) - (turns - 1), 1)


def completion(rec: dict[str, Any]) -> Completion:
    """Return the report's view of one completed journal record."""
    usage = _usage(rec)
    timings = rec.get("timings") or {}
    last_turn = (rec.get("turn_results") or [{}])[-1]
    return Completion(
        source=rec.get("source") or source_of(rec["id"]),
        finish_reason=str(rec.get("finish_reason")),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        server=str(rec.get("server") or last_turn.get("server") or ""),
        model=str(rec.get("model") or ""),
        finished_at=float(timings.get("finished_at") or 0.0),
        latency_s=float(timings.get("latency_s") or 0.0),
        attempts=_attempts(rec, timings),
        server_version=str(rec.get("server_version") or last_turn.get("server_version") or ""),
        weight_version=str(rec.get("weight_version") or last_turn.get("weight_version") or ""),
        reasoning_tokens=_reasoning_tokens(rec),
        prompt_id=str(rec["id"]),
        variant=str((rec.get("sampling") or {}).get("variant") or ""),
    )


def encode_facts(records: Iterable[Mapping[str, Any]]) -> bytes:
    """Return the facts file of a shard's final journal records (one per prompt id).

    Deterministic (sorted by prompt id, canonical JSON): a retried upload writes the same bytes.
    """
    completed = sorted((completion(dict(r)) for r in records if r.get("status") == "completed"),
                       key=lambda c: c.prompt_id)
    failed = sorted((str(r.get("id")), int(r.get("attempts") or 1)) for r in records
                    if r.get("status") == "failed")
    doc = {"version": FACTS_VERSION,
           "completions": {f: [getattr(c, f) for c in completed] for f in _FIELDS},
           "failed_attempts": [a for _, a in failed]}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def decode_facts(data: bytes) -> tuple[list[Completion], list[int]] | None:
    """Return ``(completions, failed attempts)`` of a facts file; None for another format."""
    doc = json.loads(data)
    if doc.get("version") != FACTS_VERSION:
        return None
    columns = doc["completions"]
    for name in _REPEATED:  # a few servers, models, sources: one string object each
        columns[name] = [sys.intern(v) if isinstance(v, str) else v for v in columns[name]]
    rows = zip(*(columns[f] for f in _FIELDS), strict=True)
    return [Completion(*row) for row in rows], [int(a) for a in doc["failed_attempts"]]


_FIELDS = tuple(f.name for f in fields(Completion))
_REPEATED = ("source", "finish_reason", "server", "model", "server_version",
             "weight_version", "variant")
