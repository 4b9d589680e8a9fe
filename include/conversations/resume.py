"""Per-turn journal records, and the chains a retry continues from them.

Each finished turn is journaled as it finishes (``turn_record``): the turn's result as the
server returned it, its dataset slice, and the digests that chain it to the turn before.
A conversation's end is in its final record (``records.conversation_record``, written by
the engine when it ends), which a retry reads as any finished prompt. The dataset
conversation itself is not
repeated: it is in the prompt shard, and ``resume`` replays the records over ``chain.start``
states built from it, so a resumed state is exactly the state the records were written from
(a record that does not follow from its conversation is an error, not a guess).

The journal keeps the first record per ``id``; a turn's id holds its digest, so two tries
that produced the same turn collapse into one and two that differ stay apart. Of differing
tries of one turn, the one the chain continued furthest from wins (then the smaller digest):
deterministic in any record order. A record whose parent turn is missing is a gap: an error.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from include.conversations.chain import (
    ROOT_DIGEST,
    ChainState,
    TurnResult,
    after_turn,
)
from include.outcomes import TURN_KIND


class ResumeError(ValueError):
    """The journal's turns of a conversation cannot be continued (a gap, or a mismatch)."""


def turn_record(state: ChainState) -> dict[str, Any]:
    """Return the journal record of the last turn of ``state`` (as ``after_turn`` left it)."""
    if not state.turns:
        raise ValueError(f"{state.conversation_id}: no turn to record")
    turn = state.turns[-1]
    parent = state.turns[-2].digest if len(state.turns) > 1 else ROOT_DIGEST
    r = turn.result
    return {
        "id": f"{state.conversation_id}#turn-{turn.index}@{turn.digest}",
        "kind": TURN_KIND, "status": "completed", "conversation_id": state.conversation_id,
        "turn": turn.index, "parent": parent, "digest": turn.digest,
        "inputs": list(turn.inputs), "next_index": state.next_index,
        "text": r.text, "finish_reason": r.finish_reason, "matched_stop": r.matched_stop,
        "prompt_token_ids": r.prompt_token_ids, "response_token_ids": r.response_token_ids,
        "usage": dict(r.usage), "server": r.server,
        # Written for readers of the journal (monitor, report); resume recomputes it.
        "end": None if state.end is None else {"reason": state.end.reason,
                                               "detail": state.end.detail},
    }


def resume(
    records: Iterable[Mapping[str, Any]], starts: Mapping[str, ChainState]
) -> dict[str, ChainState]:
    """Return each conversation of ``starts`` at its next turn, from its journal records.

    ``starts``: ``chain.start`` states of the shard's conversations; those without records
    come back as they are. Records of other conversations (and other record kinds) are
    skipped. Raises ResumeError on a gap or a record that does not follow from the
    conversation.
    """
    grouped: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        cid = record.get("conversation_id")
        if record.get("kind") != TURN_KIND or cid not in starts:
            continue
        grouped.setdefault(str(cid), []).append(dict(record))
    out = dict(starts)
    for cid, turns in grouped.items():
        out[cid] = _replay(starts[cid], turns)
    return out


def _replay(state: ChainState, turns: list[dict[str, Any]]) -> ChainState:
    cid = state.conversation_id
    known = {ROOT_DIGEST: -1} | {r["digest"]: r["turn"] for r in turns}
    children: dict[str, list[dict[str, Any]]] = {}
    for r in turns:
        if r["parent"] not in known or known[r["parent"]] != r["turn"] - 1:
            raise ResumeError(f"{cid}: turn {r['turn']} is journaled, but not the turn before "
                              "it: the journal has a gap")
        children.setdefault(r["parent"], []).append(r)
    depth: dict[str, int] = {}

    def reach(digest: str) -> int:  # how many turns the chain went on after ``digest``
        if digest not in depth:
            depth[digest] = max((1 + reach(c["digest"]) for c in children.get(digest, [])),
                                default=0)
        return depth[digest]

    parent = ROOT_DIGEST
    while state.end is None and children.get(parent):
        best = min(children[parent], key=lambda r: (-reach(r["digest"]), r["digest"],
                                                    json.dumps(r, sort_keys=True)))
        state = after_turn(state, TurnResult(
            best["text"], best["finish_reason"], best.get("matched_stop"),
            best.get("prompt_token_ids"), best.get("response_token_ids"),
            best.get("usage") or {}, best.get("server") or ""))
        turn = state.turns[-1] if state.turns else None
        if (turn is None or turn.digest != best["digest"] or list(turn.inputs) != best["inputs"]
                or state.next_index != best["next_index"]):
            raise ResumeError(f"{cid}: journaled turn {best['turn']} does not follow from the "
                              "conversation in the prompt shard (another dataset row?)")
        parent = best["digest"]
    if state.end is not None and children.get(parent):
        # E.g. a journal written before agent actions were read in every fence form:
        # its later turns follow an observation of a command the target never ran.
        raise ResumeError(f"{cid}: turns journaled after the conversation ended "
                          f"({state.end.reason}: {state.end.detail}); a journal written "
                          "by a release that paired calls otherwise cannot be continued: "
                          "generate the shard again with force_regenerate")
    return state
