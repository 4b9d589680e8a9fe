"""Send the held-out split under one condition and journal each request: resumable.

The journal is the durability stage's (``include.durability.journal``): one record per
request id, the first final one wins, a retryable failure (connection, timeout, 5xx, queue
full) is sent again by the next pass. So a retried task sends only what is missing and no
request is counted twice.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import aiohttp

from include.durability.journal import Journal, is_final
from include.evaluation.records import Condition, record_from_answer, request_body
from include.sglang import aio


async def measure(urls: Sequence[str], prompts: Sequence[dict[str, Any]], cond: Condition,
                  journal: Journal, *, model: str, max_tokens: int,
                  headers: dict[str, str] | None = None, concurrency: int = 8,
                  timeout_s: float = 600.0) -> Counter[str]:
    """Answer every prompt not yet final in ``journal``; return the statuses of this pass.

    Requests go round-robin over ``urls`` (servers of one drafter configuration), at most
    ``concurrency`` in flight, so latency is measured at a stated load.
    """
    done = journal.load()
    todo = [p for p in prompts if not (cond.key(p["id"]) in done
                                       and is_final(done[cond.key(p["id"])]))]
    counts: Counter[str] = Counter({"resumed": len(prompts) - len(todo)})
    gate = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def one(i: int, prompt: dict[str, Any], session: aiohttp.ClientSession) -> None:
        async with gate:
            body = request_body(prompt, cond, model, max_tokens)
            start = time.monotonic()
            answer = await aio.chat(session, urls[i % len(urls)], body, headers, timeout)
            record = record_from_answer(prompt, cond, answer, time.monotonic() - start)
        journal.append(record)
        journal.flush_if_due()
        counts[record["status"]] += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(one(i, p, session) for i, p in enumerate(todo)))
    journal.flush()
    return counts


def run_pass(urls: Sequence[str], prompts: Sequence[dict[str, Any]], cond: Condition,
             journal: Journal, **kwargs: Any) -> Counter[str]:
    """``measure`` from synchronous code (a task body)."""
    return asyncio.run(measure(urls, prompts, cond, journal, **kwargs))
