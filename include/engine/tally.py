"""What a shard run has finished so far: each prompt's final record, and the counts.

Every final record goes to the journal as it is made; the counters feed the progress line
and the shard's outcome.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from include.durability.journal import Journal, is_final
from include.engine import client as c
from include.outcomes import PromptStatus, ServerStatus

log = logging.getLogger(__name__)

#: How often the progress loop looks for the first answers: its first line follows them
#: within this (progress lines only).
FIRST_ANSWER_POLL_S = 0.25


class Tally:
    """The final records of one shard run and its counters."""

    def __init__(self, shard_id: str, journal: Journal, sampling: dict[str, Any]) -> None:
        self.shard_id = shard_id
        self.journal = journal
        self.sampling = sampling
        self.records: dict[str, dict[str, Any]] = {}
        self.counts = collections.Counter(dict.fromkeys(map(str, PromptStatus), 0))
        self.truncated = 0
        self.output_tokens = 0
        self.completed_here = 0  # completions of this run (not from the journal), for rates
        #: Requests sent, retries by reason, journaled retryable failures tried again.
        self.requests = 0
        self.retries: collections.Counter[str] = collections.Counter()
        self.retried_failures = 0

    def resume(self, ids: Iterable[str]) -> int:
        """Take the journal's final records of ``ids``; return how many there are.

        A journaled retryable failure is not final: its prompt is generated again.
        """
        wanted = set(ids)
        for pid, record in self.journal.load().items():
            if pid not in wanted:
                continue
            if not is_final(record):
                self.retried_failures += 1
                continue
            self.records[pid] = record
            self.counts[record["status"]] += 1
            if record.get("finish_reason") == "length":
                self.truncated += 1
        return len(self.records)

    def finish(self, record: dict[str, Any]) -> None:
        """Journal a prompt's final record and count it."""
        self.journal.append(record)
        self.records[record["id"]] = record
        self.counts[record["status"]] += 1

    def skip(self, prompt_id: str, prompt_tokens: int, reason: str, detail: str) -> None:
        """Record a prompt that is not sent, and why."""
        self.finish({"id": prompt_id, "status": PromptStatus.SKIPPED, "reason": reason,
                     "detail": detail, "prompt_tokens": prompt_tokens})

    def fail(self, prompt_id: str, result: c.ChatResult, attempts: int) -> None:
        """Record a failed prompt (a retryable reason is final for this run only)."""
        self.finish({
            "id": prompt_id, "status": PromptStatus.FAILED, "reason": result.error_kind,
            "detail": result.error, "server": result.server, "http_status": result.status,
            "attempts": attempts,
        })
        log.warning("%s: prompt %s failed on %s after %d attempt(s): %s (HTTP %s) %s",
                    self.shard_id, prompt_id, result.server, attempts, result.error_kind,
                    result.status, result.error[:300])

    def complete(self, prompt: dict[str, Any], result: c.ChatResult, server: str,
                 max_tokens: int, attempts: int, sampling: dict[str, Any] | None = None,
                 server_version: str | None = None) -> None:
        """Record a completion."""
        # The prompt (messages, metadata) is already in the prompt shard; the journal keeps
        # only what generation added, and the output joins the two.
        self.finish({
            "id": prompt["id"], "source": prompt.get("source"), "status": PromptStatus.COMPLETED,
            "text": result.text, "finish_reason": result.finish_reason,
            "matched_stop": result.matched_stop, "usage": result.usage,
            "model": result.model, "server": server, "server_version": server_version,
            "weight_version": result.weight_version,
            "sampling": {**(sampling or self.sampling), "max_tokens": max_tokens},
            "timings": {"latency_s": round(result.latency_s, 4), "attempts": attempts,
                        "finished_at": round(time.time(), 3)},
            # Present only when the server returned them (SGLang >= 0.5.23).
            **({"prompt_token_ids": result.prompt_token_ids}
               if result.prompt_token_ids is not None else {}),
            **({"response_token_ids": result.response_token_ids}
               if result.response_token_ids is not None else {}),
        })
        if result.finish_reason == "length":
            self.truncated += 1
        self.output_tokens += int(result.usage.get("completion_tokens") or 0)
        self.completed_here += 1

    async def progress_lines(self, interval_s: float, log_line: Callable[[], None]) -> None:
        """Call ``log_line`` soon after the first answers (so the line has a rate and an ETA;
        a line at 1 s said "0/20" and short shards then said nothing until done, issue 34),
        or after one interval if no answer comes; then once per interval, until cancelled."""
        first = (self.completed_here, self.output_tokens)
        waited = 0.0
        while (self.completed_here, self.output_tokens) == first and waited < interval_s:
            await asyncio.sleep(FIRST_ANSWER_POLL_S)
            waited += FIRST_ANSWER_POLL_S
        while True:
            log_line()
            await asyncio.sleep(interval_s)

    def log_progress(self, total: int, elapsed: float, in_flight: int,
                     servers: dict[str, int], final: bool = False) -> None:
        """Log the progress line (``servers``: how many are in each state)."""
        elapsed = max(elapsed, 1e-9)
        finished = sum(self.counts.values())
        rate = self.completed_here / elapsed
        eta = f"{(total - finished) / rate:.0f}s" if rate > 0 else "-"
        retries = ", ".join(f"{k} {n}" for k, n in self.retries.most_common())
        log.info(
            "%s %s: %d/%d finished (ok %d, skipped %d, failed %d, truncated %d) | %.2f req/s, "
            "%.0f output tok/s | ETA %s | in flight %d | %d requests, retries %d%s | servers "
            "in rotation %d/%d, resting %d, ejected %d",
            self.shard_id, "done" if final else "progress", finished, total,
            *(self.counts[s] for s in PromptStatus), self.truncated,
            rate, self.output_tokens / elapsed, eta, in_flight, self.requests,
            sum(self.retries.values()), f" ({retries})" if retries else "",
            servers[ServerStatus.IN_ROTATION], sum(servers.values()),
            servers[ServerStatus.RESTING], servers[ServerStatus.EJECTED],
        )
