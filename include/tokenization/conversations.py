"""Whole conversations (``turns: all``) in the tokenization stage: turns out, rows back in.

A conversation record (docs/data-layout.md) holds the dataset conversation (``messages``) and
the target's turns (``turn_results``: each with the dataset slice it answered, the server's
prompt ids and sampled ids). ``explode`` turns it into one single-turn record per target turn,
``<conversation id>#turn-<k>``, whose ``messages`` are the request exactly as it was sent
(the dataset turns before it, each followed by the target's own answer). Those go through the
same quality filters, assembly and checks as any record, so every turn is checked against the
server's own data.

``merge`` then writes one whole-conversation row (id = the conversation id;
``include.conversations.rows`` says what it is and when it exists) where every turn of the
conversation became a row from the server's ids; elsewhere the per-turn rows stay, and the
manifest counts why, by first difference.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from include.conversations.rows import Stability, whole_row
from include.tokenization.assembly import GENERATED_MARK
from include.tokenization.outputs import Sample, TokenizeResult

#: Keys of a conversation record that do not carry over to its turns' records.
_CONVERSATION_ONLY = ("turn_results", "messages", "end", "turns")


def turn_id(conversation_id: str, index: int) -> str:
    """Return the row id of a conversation's turn ``index``."""
    return f"{conversation_id}#turn-{index}"


@dataclass
class ShardConversations:
    """The conversations of one shard: their turns' ids, and what became of them."""

    turns: dict[str, list[str]] = field(default_factory=dict)
    #: The turn records by id (the server's ids are read back from them, not from samples).
    records: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    ends: Counter[str] = field(default_factory=Counter)
    whole_rows: int = 0
    turn_rows: int = 0
    #: Why a conversation's turns stayed separate, by reason.
    kept_apart: Counter[str] = field(default_factory=Counter)
    #: The first prefix-stability difference seen (an example for the manifest).
    example: str = ""
    #: Whole and per-turn rows by the conversation's source.
    by_source: dict[str, Counter[str]] = field(default_factory=dict)

    def manifest(self) -> dict[str, Any]:
        """Return the counts the tokenized manifest records under ``conversations``."""
        return {"conversations": len(self.turns), "turns": sum(map(len, self.turns.values())),
                "whole_rows": self.whole_rows, "turn_rows": self.turn_rows,
                "kept_apart": dict(sorted(self.kept_apart.items())),
                "ends": dict(sorted(self.ends.items())), "example_difference": self.example,
                "by_source": {src: {"whole_rows": c["whole_rows"], "turn_rows": c["turn_rows"]}
                              for src, c in sorted(self.by_source.items())}}

    def count_rows(self, cid: str, kind: str, n: int) -> None:
        """Count ``n`` rows of ``kind`` (``whole_rows``, ``turn_rows``) for conversation ``cid``."""
        source = str(self.records[self.turns[cid][0]].get("source", "")) \
            if self.turns[cid] else ""
        self.by_source.setdefault(source, Counter())[kind] += n


def explode(records: Iterable[Mapping[str, Any]]
            ) -> tuple[list[Mapping[str, Any]], ShardConversations]:
    """Return the records with each conversation replaced by its turns' records."""
    out: list[Mapping[str, Any]] = []
    found = ShardConversations()
    for record in records:
        if record.get("turns") != "all":
            out.append(record)
            continue
        cid = str(record["id"])
        source = list(record.get("messages") or [])
        common = {k: v for k, v in record.items() if k not in _CONVERSATION_ONLY}
        history: list[dict[str, Any]] = []
        ids = []
        for turn in record.get("turn_results") or []:
            begin, stop = turn["inputs"]
            request = [*history, *source[begin:stop]]
            tid = turn_id(cid, int(turn["index"]))
            flat = {**common, **turn, "id": tid, "messages": request, "conversation_id": cid,
                    "status": "completed"}
            out.append(flat)
            found.records[tid] = flat
            ids.append(tid)
            history = [*request, {"role": "assistant", "content": turn.get("text") or "",
                                  GENERATED_MARK: True}]
        found.turns[cid] = ids
        found.ends[str((record.get("end") or {}).get("reason", "unknown"))] += 1
    return out, found


def merge(result: TokenizeResult, found: ShardConversations, *, whole_rows: bool = True) -> None:
    """Replace the per-turn samples of each prefix-stable conversation by one whole row.

    ``whole_rows`` False (``include_reasoning: false``: each turn's think block is outside
    its own row's loss, which one sequence cannot say) keeps every conversation per turn.
    """
    if not found.turns:
        return
    by_id = {s.id: s for s in result.samples}
    replaced: dict[str, Sample | None] = {}
    for cid, ids in found.turns.items():
        reason = _apart(ids, by_id, found, whole_rows)
        if reason is None:
            pairs = [(found.records[t]["prompt_token_ids"], found.records[t]["response_token_ids"])
                     for t in ids]
            built = whole_row(pairs)
            if not isinstance(built, Stability):
                replaced.update(dict.fromkeys(ids[:-1]))
                replaced[ids[-1]] = _whole(cid, [by_id[t] for t in ids], *built)
                found.whole_rows += 1
                found.count_rows(cid, "whole_rows", 1)
                continue
            reason = "not_prefix_stable"
            found.example = found.example or f"{cid}: {built.detail}"
        found.kept_apart[reason] += 1
        kept = sum(t in by_id for t in ids)
        found.turn_rows += kept
        found.count_rows(cid, "turn_rows", kept)
    if replaced:
        result.samples = [replaced.get(s.id, s) if s.id in replaced else s
                          for s in result.samples]
        result.samples = [s for s in result.samples if s is not None]


def _apart(ids: list[str], by_id: Mapping[str, Sample], found: ShardConversations,
           whole_rows: bool) -> str | None:
    """Return why a conversation cannot be one row (None: it can, if prefix-stable)."""
    if len(ids) < 2:
        return "one_turn"
    if not whole_rows:
        return "include_reasoning_off"
    if not all(t in by_id for t in ids):
        return "a_turn_kept_out"
    if any(by_id[t].token_source != "server" for t in ids):
        return "no_server_ids"
    if any(len(by_id[t].input_ids) != len(found.records[t]["prompt_token_ids"])
           + len(found.records[t]["response_token_ids"]) for t in ids):
        return "a_turn_changed_by_its_row"  # closed by the template, or cut to a length
    return None


def _whole(cid: str, samples: list[Sample], ids: list[int], mask: list[int]) -> Sample:
    """Return the whole-conversation sample (``rows.whole_row``'s ids and mask)."""
    last = samples[-1]
    return Sample(cid, last.source, last.finish_reason, ids, mask, last.conversation,
                  last.token_source, {**last.provenance, "turns": len(samples)})
