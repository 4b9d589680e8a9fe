"""Client overhead: requests/s and client CPU per 1,000 requests against zero-latency servers.

Eight stand-ins answer at once (``--standin-zero-latency``), so what limits throughput is the
client (and the servers' own request handling, the same for every client). Measured in the
same run, on the same prompts and servers:

* this engine, with its token budget (chat template + tokenizer per prompt) and journal on;
* ``openai.AsyncOpenAI`` (one client per server) with a semaphore, the common alternative;
* a bare aiohttp loop with no bookkeeping: the limit.

Client CPU is this process's CPU time (``time.process_time``), so server work is excluded.

    python -m benchmarks.bench_client_overhead [--requests 3000] [--concurrency 128]

Prints a table, then one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.common import SERVERS, standin_fleet
from include.durability.journal import FileJournal
from include.engine.dispatch import EngineConfig, run_shard
from include.target_tokenizer import count_prompt_tokens, load_tokenizer

MAX_TOKENS = 32
SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "enable_thinking": False}


def _prompts(n: int) -> list[dict[str, Any]]:
    return [{"id": f"o:{i}", "source": "bench", "metadata": {},
             "messages": [{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}]}
            for i in range(n)]


def _timed(fn: Callable[[], int]) -> dict[str, float]:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    done = fn()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"req_per_s": done / wall, "cpu_s_per_1k": 1000 * cpu / done, "ok": done,
            "seconds": wall}


def engine_run(urls: list[str], prompts: list[dict], tok_dir: Path, concurrency: int) -> int:
    """Run the prompts through the engine (budget + journal on); return completions."""
    tokenizer = load_tokenizer(str(tok_dir))
    config = EngineConfig(
        model="bench", context_length=32768, max_tokens=MAX_TOKENS, context_margin=16,
        min_completion_tokens=1, sampling=SAMPLING, concurrency_mode="fixed",
        in_flight_per_server=max(1, concurrency // len(urls)), progress_interval_s=3600,
    )
    with tempfile.TemporaryDirectory() as tmp:
        outcome = run_shard(
            "bench", prompts, urls, FileJournal(Path(tmp) / "journal.jsonl"), config,
            lambda convs: count_prompt_tokens(tokenizer, convs, False),
        )
    return outcome.counts["completed"]


def openai_run(urls: list[str], prompts: list[dict], concurrency: int) -> int:
    """Send the prompts with AsyncOpenAI clients and a semaphore; return completions."""
    from openai import AsyncOpenAI

    async def go() -> int:
        clients = [AsyncOpenAI(base_url=u + "/v1", api_key="none", max_retries=2)
                   for u in urls]
        sem = asyncio.Semaphore(concurrency)
        ok = 0

        async def one(i: int, p: dict) -> None:
            nonlocal ok
            async with sem:
                resp = await clients[i % len(clients)].chat.completions.create(
                    model="bench", messages=p["messages"], max_tokens=MAX_TOKENS,
                    temperature=SAMPLING["temperature"], top_p=SAMPLING["top_p"],
                    extra_body={"top_k": SAMPLING["top_k"],
                                "chat_template_kwargs": {"enable_thinking": False}},
                )
                if resp.choices[0].message is not None:
                    ok += 1

        await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        for c in clients:
            await c.close()
        return ok

    return asyncio.run(go())


def bare_run(urls: list[str], prompts: list[dict], concurrency: int) -> int:
    """Send the prompts with one aiohttp session and a semaphore, reading only the status."""
    async def go() -> int:
        sem = asyncio.Semaphore(concurrency)
        ok = 0
        connector = aiohttp.TCPConnector(limit=concurrency + SERVERS)
        async with aiohttp.ClientSession(connector=connector) as session:
            async def one(i: int, p: dict) -> None:
                nonlocal ok
                body = {"model": "bench", "messages": p["messages"], "max_tokens": MAX_TOKENS,
                        "chat_template_kwargs": {"enable_thinking": False}}
                async with sem, session.post(urls[i % len(urls)] + "/v1/chat/completions",
                                             json=body) as resp:
                    await resp.read()
                    ok += resp.status == 200

            await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        return ok

    return asyncio.run(go())


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=128)
    args = parser.parse_args()
    with standin_fleet("overhead", standin_zero_latency=True) as fleet:
        urls = fleet.urls
        prompts = _prompts(args.requests)
        bare_run(urls, prompts[:200], args.concurrency)  # warm every server's caches once
        results = {
            "engine": _timed(lambda: engine_run(urls, prompts, fleet.tokenizer_dir,
                                                args.concurrency)),
            "openai": _timed(lambda: openai_run(urls, prompts, args.concurrency)),
            "bare": _timed(lambda: bare_run(urls, prompts, args.concurrency)),
        }
    print(f"{'client':<26}{'req/s':>9}{'cpu s/1k':>10}{'ok':>7}")
    names = {"engine": "engine (budget+journal)", "openai": "AsyncOpenAI + semaphore",
             "bare": "bare aiohttp (limit)"}
    for key, r in results.items():
        print(f"{names[key]:<26}{r['req_per_s']:>9.0f}{r['cpu_s_per_1k']:>10.3f}{r['ok']:>7}")
    e, o, b = results["engine"], results["openai"], results["bare"]
    print(json.dumps({
        "bench": "client_overhead",
        "requests": args.requests,
        "req_per_s": round(e["req_per_s"], 1),
        "baseline_req_per_s": round(o["req_per_s"], 1),
        "bare_req_per_s": round(b["req_per_s"], 1),
        "cpu_s_per_1k": round(e["cpu_s_per_1k"], 4),
        "baseline_cpu_s_per_1k": round(o["cpu_s_per_1k"], 4),
        "bare_cpu_s_per_1k": round(b["cpu_s_per_1k"], 4),
        "speedup_vs_openai": round(e["req_per_s"] / o["req_per_s"], 3),
        "cpu_ratio_vs_openai": round(o["cpu_s_per_1k"] / e["cpu_s_per_1k"], 3),
        "fraction_of_bare": round(e["req_per_s"] / b["req_per_s"], 3),
    }))


if __name__ == "__main__":
    main()
