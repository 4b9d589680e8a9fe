"""What a shard run ends with: one final record per prompt, and the check that it is so."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from include.outcomes import GenerationError, PromptStatus


@dataclass
class ShardOutcome:
    """What a shard run did; ``records`` holds the final journal record per prompt id."""

    shard_id: str
    total: int
    resumed: int
    #: Out of the repr: Python 3.11's asyncio.run reprs the run's result as it ends (its
    #: SIGINT check formats the handler, which holds the task), and with every record, text
    #: and token ids in it that was ~6% of a shard's client CPU (bench_client_overhead).
    records: dict[str, dict[str, Any]] = field(repr=False)
    counts: dict[str, int]
    truncated: int
    elapsed_s: float
    output_tokens: int
    servers: list[dict[str, Any]]
    #: ``time.monotonic()`` when the run started, and seconds from then to the last dispatch
    #: (after it only the drain is left: the longest requests finishing).
    started_monotonic: float = 0.0
    last_dispatch_s: float = 0.0
    #: Requests sent by this run, and its retries by reason (``server_ejected``: taken back
    #: from a server that was gone, not counted against the prompt).
    requests: int = 0
    retries: dict[str, int] = field(default_factory=dict)
    #: Journaled retryable failures this run tried again.
    retried_failures: int = 0
    #: Whole conversations (``turns: all``): turns, ends, affinity moves; {} if none.
    conversations: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        """Return the one-line result for logs."""
        return (
            f"{self.shard_id}: {self.counts[PromptStatus.COMPLETED]} completed "
            f"({self.truncated} truncated), {self.counts[PromptStatus.SKIPPED]} skipped, "
            f"{self.counts[PromptStatus.FAILED]} failed of {self.total} "
            f"({self.resumed} from the journal) in {self.elapsed_s:.1f}s, "
            f"{self.output_tokens / max(self.elapsed_s, 1e-9):.0f} output tok/s, "
            f"{self.requests} requests, {sum(self.retries.values())} retries"
            + (f"; {self.conversations['turns']} turns of {self.conversations['conversations']}"
               f" conversations, ends {self.conversations['ends']}, moved "
               f"{self.conversations['moved']}" if self.conversations else "")
        )


def check_accounting(prompt_ids: Sequence[str], records: dict[str, dict[str, Any]]) -> None:
    """Raise GenerationError unless every prompt id has exactly one final record."""
    ids = list(prompt_ids)
    if len(set(ids)) != len(ids):
        dupes = [i for i, n in collections.Counter(ids).items() if n > 1][:5]
        raise GenerationError(f"the shard holds duplicate prompt ids, e.g. {dupes}")
    id_set = set(ids)
    missing = [i for i in ids if i not in records][:5]
    extra = [i for i in records if i not in id_set][:5]
    bad = [i for i, r in records.items() if r.get("status") not in set(PromptStatus)]
    if missing or extra or bad:
        raise GenerationError(
            f"accounting failed: missing {missing}, unknown {extra}, bad status {bad[:5]}"
        )
