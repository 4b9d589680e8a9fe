"""Multi-turn: whole conversations (``turns: all``) against eight stand-ins with a radix cache.

Deterministic (seeded) conversations of 2-8 turns: Infinity-Instruct-shaped chats (user
turns of 30-400 words, an optional short system prompt) and Hermes-shaped tool conversations
(a function-calling system prompt listing several functions, ~1-3k tokens; rounds of a user
question, the original call to the first listed function with ``{}`` arguments, a tool
result of ~100-400 tokens and an answer; sometimes a last plain follow-up question). The
stand-ins answer a prompt offering ``<tools>`` with that same call at ``--tool-call-rate``
(the rest diverge), report ``cached_tokens`` (``--enable-cache-report``) and prefill only a
prompt's uncached tokens. Three runs on the same servers and conversations, each after
``/flush_cache`` on every server:

1. ``turns: all`` with conversation affinity (the engine's default);
2. ``turns: all`` without it (``EngineConfig(conversation_affinity=False)``: most free room);
3. single turn: each conversation's first request only (messages cut after the first user
   turn, no ``turns`` key), as a normal prompt record.

Busy fraction comes from the requests' spans (``finished_at - latency_s`` to ``finished_at``
of each turn and completion, per server): the share of the run's wall time (``run_shard``'s
call) with at least one request in flight, averaged over the servers. ``batch_fill`` is the
share of the servers' batch slots (``max_running_requests``) in use over the same time.
Throughput is output tokens/s from the servers' own ``sglang:generation_tokens_total``.

    python -m benchmarks.bench_multiturn [--conversations 160] [--batch 8] [--time-scale 0.6]

Prints a table, then one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import random
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.common import SERVERS, bench_settings, get, standin_fleet
from include.durability.journal import FileJournal
from include.engine.dispatch import EngineConfig, run_shard
from include.engine.pool import parse_metrics
from include.target_tokenizer import count_prompt_tokens, load_tokenizer
from sglang_standin.tokenizer import cached_chat_tokenizer
from sglang_standin.words import WORDS

GOAL_BUSY_RATIO = 0.9
GOAL_CACHED_SHARE = 0.8
HERMES_SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user "
    "query. Don't make assumptions about what values to plug into functions. Here are the "
    "available tools: <tools> {tools} </tools> Use the following pydantic model json schema "
    "for each tool call you will make: {{\"properties\": {{\"arguments\": {{\"title\": "
    "\"Arguments\", \"type\": \"object\"}}, \"name\": {{\"title\": \"Name\", \"type\": "
    "\"string\"}}}}, \"required\": [\"arguments\", \"name\"], \"title\": \"FunctionCall\", "
    "\"type\": \"object\"}} For each function call return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags as follows:\n<tool_call>\n"
    "{{\"arguments\": <args-dict>, \"name\": <function-name>}}\n</tool_call>"
)


# --- conversations -----------------------------------------------------------------------
def _prose(rng: random.Random, n_words: int) -> str:
    words = [rng.choice(WORDS) for _ in range(max(1, n_words))]
    for i in range(0, len(words), rng.randint(8, 18)):
        words[i] = words[i].capitalize()
    return " ".join(words) + rng.choice([".", "?", "."])


def _user_words(rng: random.Random) -> int:
    # Long-tailed like real user turns: most a few sentences, some whole documents.
    return int(min(400, max(30, rng.lognormvariate(4.6, 0.7))))


def _function(rng: random.Random, name: str) -> dict[str, Any]:
    props = {}
    for _ in range(rng.randint(2, 6)):
        prop: dict[str, Any] = {"type": rng.choice(["string", "integer", "number", "boolean"]),
                                "description": _prose(rng, rng.randint(8, 30))}
        if prop["type"] == "string" and rng.random() < 0.3:
            prop["enum"] = [rng.choice(WORDS) for _ in range(rng.randint(2, 5))]
        props[f"{rng.choice(WORDS)}_{rng.choice(WORDS)}"] = prop
    return {"type": "function", "function": {
        "name": name, "description": _prose(rng, rng.randint(15, 50)),
        "parameters": {"type": "object", "properties": props,
                       "required": sorted(rng.sample(sorted(props), k=rng.randint(1, len(props))))},
    }}


def _tool_result(rng: random.Random) -> str:
    fields = {f"{rng.choice(WORDS)}_{k}": (_prose(rng, rng.randint(4, 20)) if rng.random() < 0.6
                                           else round(rng.uniform(0, 1000), 2))
              for k in range(rng.randint(6, 20))}
    return json.dumps(fields)


def chat_conversation(i: int, rng: random.Random) -> dict[str, Any]:
    """Return an Infinity-Instruct-shaped conversation of 2-8 user turns."""
    messages = [{"role": "system", "content": "You are a helpful assistant."}] \
        if rng.random() < 0.1 else []
    for _ in range(rng.randint(2, 8)):
        messages += [{"role": "user", "content": _prose(rng, _user_words(rng))},
                     {"role": "assistant", "content": _prose(rng, rng.randint(40, 300))}]
    return {"id": f"infinity_instruct:{i}", "source": "infinity_instruct", "metadata": {},
            "messages": messages, "turns": "all", "call_format": "tool_call"}


def tool_conversation(i: int, rng: random.Random) -> dict[str, Any]:
    """Return a Hermes-shaped tool conversation of 2-8 turns (see the module docstring)."""
    names = rng.sample([f"{v}_{n}" for v in ("get", "find", "create", "update", "list", "check")
                        for n in WORDS[40:120]], k=rng.randint(4, 9))
    tools = [_function(rng, n) for n in names]
    # Hermes v1 records its calls as Python dict reprs; the chain reads them leniently.
    call = f"<tool_call>\n{{'arguments': {{}}, 'name': '{names[0]}'}}\n</tool_call>"
    messages = [{"role": "system", "content": HERMES_SYSTEM.format(tools=json.dumps(tools))}]
    rounds = rng.randint(1, 4)
    for _ in range(rounds):
        messages += [{"role": "user", "content": _prose(rng, rng.randint(15, 80))},
                     {"role": "assistant", "content": call},
                     {"role": "tool", "content": _tool_result(rng)},
                     {"role": "assistant", "content": _prose(rng, rng.randint(30, 150))}]
    if rounds < 4 and rng.random() < 0.5:
        messages += [{"role": "user", "content": _prose(rng, rng.randint(10, 60))},
                     {"role": "assistant", "content": _prose(rng, rng.randint(30, 150))}]
    return {"id": f"hermes_function_calling:{i}", "source": "hermes_function_calling",
            "metadata": {}, "messages": messages, "turns": "all", "call_format": "tool_call"}


def conversations(n: int, hermes_share: float, seed: int) -> list[dict[str, Any]]:
    """Return ``n`` conversations, ``hermes_share`` of them tool conversations, shuffled."""
    rng = random.Random(seed)
    n_tool = round(n * hermes_share)
    out = [tool_conversation(i, rng) for i in range(n_tool)]
    out += [chat_conversation(i, rng) for i in range(n - n_tool)]
    rng.shuffle(out)
    return out


def first_requests(convs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return each conversation's first request as a single-turn prompt record."""
    out = []
    for conv in convs:
        messages = conv["messages"]
        cut = next(k for k, m in enumerate(messages) if m["role"] == "user") + 1
        out.append({"id": conv["id"], "source": conv["source"], "metadata": {},
                    "messages": messages[:cut]})
    return out


# --- measuring ---------------------------------------------------------------------------
def _counters(urls: list[str]) -> collections.Counter[str]:
    total: collections.Counter[str] = collections.Counter()
    for url in urls:
        metrics = parse_metrics(get(url + "/metrics"))
        for key in ("generation_tokens_total", "prompt_tokens_total", "cached_tokens_total"):
            total[key] += metrics.get(f"sglang:{key}", 0.0)
    return total


def _flush(urls: list[str]) -> None:
    # Each run starts cold: the previous run's histories must not serve this one.
    for url in urls:
        urllib.request.urlopen(urllib.request.Request(url + "/flush_cache", method="POST"),
                               timeout=10).read()


def spans(records: dict[str, dict[str, Any]]) -> list[tuple[str, float, float]]:
    """Return (server, start, end) of every finished request: each turn and completion."""
    out = []
    for rec in records.values():
        for item in rec.get("turn_results") or ([rec] if rec.get("status") == "completed"
                                                 else []):
            t = item.get("timings") or {}
            if item.get("server") and t.get("finished_at"):
                end = float(t["finished_at"])
                out.append((item["server"], end - float(t["latency_s"]), end))
    return out


def occupancy(request_spans: list[tuple[str, float, float]], urls: list[str], t0: float,
              t1: float, batch: int) -> dict[str, Any]:
    """Return busy fractions (>= 1 request in flight), batch fill and the fleet's in-flight
    requests at tenths of the run, from request spans over the wall time [t0, t1]."""
    wall = t1 - t0
    busy, fill = {}, {}
    fleet: list[tuple[float, int]] = []
    for url in urls:
        events = sorted([(max(s, t0), 1) for u, s, _ in request_spans if u == url]
                        + [(min(e, t1), -1) for u, _, e in request_spans if u == url])
        fleet += events
        n, last, b, f = 0, t0, 0.0, 0.0
        for t, step in events:
            b += (t - last) if n > 0 else 0.0
            f += (t - last) * min(n, batch)
            n, last = n + step, t
        busy[url], fill[url] = b / wall, f / (batch * wall)
    fleet.sort()
    marks, n, k = [], 0, 0
    for tenth in range(1, 10):
        at = t0 + wall * tenth / 10
        while k < len(fleet) and fleet[k][0] <= at:
            n += fleet[k][1]
            k += 1
        marks.append(n)
    return {"busy_fraction": sum(busy.values()) / len(urls),
            "busy_min": min(busy.values()), "busy_max": max(busy.values()),
            "batch_fill": sum(fill.values()) / len(urls), "in_flight_at_tenths": marks}


def cacheable_share(records: dict[str, dict[str, Any]]) -> float:
    """Return the share of prompt tokens a perfect cache on one server could serve: each later
    turn's longest common prefix with its previous turn's prompt + sampled ids (less the last
    token, which has no KV), over all turns' prompt tokens. First turns count as uncached."""
    hit = total = 0
    for rec in records.values():
        turns = rec.get("turn_results") or []
        for k, turn in enumerate(turns):
            ids = turn.get("prompt_token_ids") or []
            total += len(ids)
            if k and ids:
                prev = turns[k - 1]
                known = (prev.get("prompt_token_ids") or []) + (prev.get("response_token_ids")
                                                                 or [])
                n = 0
                for a, b in zip(ids, known[:-1], strict=False):
                    if a != b:
                        break
                    n += 1
                hit += min(n, len(ids) - 1)
    return hit / total if total else 0.0


def same_server_share(records: dict[str, dict[str, Any]]) -> float:
    """Return the share of later turns sent to the server of their conversation's last turn."""
    pairs = [(a["server"], b["server"]) for rec in records.values()
             for a, b in itertools.pairwise(rec.get("turn_results") or [])]
    return sum(a == b for a, b in pairs) / len(pairs) if pairs else 0.0


def measure(label: str, urls: list[str], prompts: list[dict[str, Any]], config: EngineConfig,
            counter: Any, batch: int) -> dict[str, Any]:
    """Run one shard through the engine on cold caches; return its figures."""
    _flush(urls)
    before = _counters(urls)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        outcome = run_shard(f"bench-{label}", prompts, urls,
                            FileJournal(Path(tmp) / "j.jsonl"), config, counter)
        t1 = time.time()
    server = _counters(urls) - before
    conv = outcome.conversations
    prompt_tokens = conv.get("prompt_tokens") or server["prompt_tokens_total"]
    cached = conv.get("cached_tokens") if conv else server["cached_tokens_total"]
    return {
        "seconds": t1 - t0,
        "tokens_per_s": server["generation_tokens_total"] / (t1 - t0),
        "output_tokens": int(server["generation_tokens_total"]),
        "cached_token_share": cached / prompt_tokens if prompt_tokens else 0.0,
        "server_cached_share": (server["cached_tokens_total"] / server["prompt_tokens_total"]
                                if server["prompt_tokens_total"] else 0.0),
        "requests": outcome.requests,
        "counts": outcome.counts,
        "conversations": conv,
        "same_server_share": same_server_share(outcome.records),
        "cacheable_share": cacheable_share(outcome.records),
        **occupancy(spans(outcome.records), urls, t0, t1, batch),
    }


# --- report ------------------------------------------------------------------------------
def print_table(runs: dict[str, dict[str, Any]]) -> None:
    """Print one line per run, then the conversations' counters."""
    print(f"{'run':<22}{'s':>7}{'requests':>9}{'tok/s':>9}{'busy':>7}{'min-max':>12}"
          f"{'fill':>7}{'cached':>8}{'same srv':>9}  in flight at 10%..90% of the run")
    for name, r in runs.items():
        print(f"{name:<22}{r['seconds']:>7.1f}{r['requests']:>9}{r['tokens_per_s']:>9.0f}"
              f"{r['busy_fraction']:>7.3f}{r['busy_min']:>6.2f}-{r['busy_max']:.2f}"
              f"{r['batch_fill']:>7.3f}{r['cached_token_share']:>8.3f}"
              f"{r['same_server_share']:>9.3f}  {r['in_flight_at_tenths']}")
    for name in ("affinity", "no affinity"):
        c = runs[name]["conversations"]
        ends = {k: v for k, v in c["ends"].items() if v}
        print(f"{name}: {c['conversations']} conversations, {c['turns']} turns, kept on server "
              f"{c['kept_on_server']}, moved {c['moved'] or {}}, ends {ends}")


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=160)
    parser.add_argument("--hermes-share", type=float, default=0.4)
    parser.add_argument("--time-scale", type=float, default=0.6,
                        help="stand-in time scale (1.0: the performance model's own speed)")
    parser.add_argument("--batch", type=int, default=8,
                        help="stand-ins' --max-running-requests (SGLang's own: 64 and more)")
    parser.add_argument("--median-output-tokens", type=float, default=150)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--tool-call-rate", type=float, default=0.9,
                        help="share of tool-offering prompts the stand-ins answer with the call")
    parser.add_argument("--seed", type=int, default=19)
    args = parser.parse_args()

    convs = conversations(args.conversations, args.hermes_share, args.seed)
    singles = first_requests(convs)
    tok_dir = cached_chat_tokenizer("qwen3_6")
    with standin_fleet("multiturn", standin_time_scale=args.time_scale, enable_metrics=True,
                       enable_cache_report=True, tokenizer_path=str(tok_dir),
                       max_running_requests=args.batch,
                       standin_median_output_tokens=args.median_output_tokens,
                       standin_tool_call_rate=args.tool_call_rate) as fleet:
        urls = fleet.urls
        tokenizer = load_tokenizer(str(tok_dir))
        counter = lambda convs: count_prompt_tokens(tokenizer, convs, True)  # noqa: E731
        systems = [c["messages"][0] for c in convs if c["source"] == "hermes_function_calling"]
        schema_tokens = counter([[m] for m in systems]) if systems else [0]
        settings = bench_settings({"max_tokens": args.max_tokens, "model_path": "bench",
                                   "progress_interval_s": 30})
        engine = EngineConfig.from_settings(settings)
        runs = {
            "affinity": measure("affinity", urls, convs, engine, counter, args.batch),
            "no affinity": measure("no-affinity", urls, convs, EngineConfig.from_settings(
                settings, conversation_affinity=False), counter, args.batch),
            "single turn": measure("single", urls, singles, engine, counter, args.batch),
        }
        ceiling = fleet.ceiling_tokens_per_s

    aff, plain, single = runs["affinity"], runs["no affinity"], runs["single turn"]
    print_table(runs)
    busy_ratio = aff["busy_fraction"] / single["busy_fraction"]
    gain = aff["tokens_per_s"] / plain["tokens_per_s"]
    print(f"ceiling (8 stand-ins): {ceiling:.0f} tok/s; tool schemas "
          f"{min(schema_tokens)}-{max(schema_tokens)} tokens (mean "
          f"{sum(schema_tokens) / len(schema_tokens):.0f}); busy from request spans; "
          f"{args.conversations} conversations for {SERVERS} x {args.batch} batch slots; "
          f"a perfect cache could serve {aff['cacheable_share']:.3f} of the prompt tokens")
    print(f"goal busy >= {GOAL_BUSY_RATIO} x single turn: {busy_ratio:.3f} -> "
          f"{'met' if busy_ratio >= GOAL_BUSY_RATIO else 'MISSED'}; goal cached share >= "
          f"{GOAL_CACHED_SHARE}: {aff['cached_token_share']:.3f} -> "
          f"{'met' if aff['cached_token_share'] >= GOAL_CACHED_SHARE else 'MISSED'}; "
          f"throughput gain of affinity {gain:.3f}x")
    c = aff["conversations"]
    print(json.dumps({
        "bench": "multiturn",
        "busy_fraction": round(aff["busy_fraction"], 4),
        "single_turn_busy_fraction": round(single["busy_fraction"], 4),
        "busy_fraction_no_affinity": round(plain["busy_fraction"], 4),
        "busy_ratio_to_single_turn": round(busy_ratio, 4),
        "batch_fill": round(aff["batch_fill"], 4),
        "batch_fill_no_affinity": round(plain["batch_fill"], 4),
        "single_turn_batch_fill": round(single["batch_fill"], 4),
        "cached_token_share": round(aff["cached_token_share"], 4),
        "cached_token_share_no_affinity": round(plain["cached_token_share"], 4),
        "single_turn_cached_token_share": round(single["cached_token_share"], 4),
        "cacheable_share": round(aff["cacheable_share"], 4),
        "tokens_per_s": round(aff["tokens_per_s"], 1),
        "tokens_per_s_no_affinity": round(plain["tokens_per_s"], 1),
        "single_turn_tokens_per_s": round(single["tokens_per_s"], 1),
        "throughput_gain": round(gain, 4),
        "goal_busy_met": busy_ratio >= GOAL_BUSY_RATIO,
        "goal_cached_met": aff["cached_token_share"] >= GOAL_CACHED_SHARE,
        "conversations": c["conversations"],
        "turns": c["turns"],
        "ends": c["ends"],
        "moved": c["moved"],
        "kept_on_server": c["kept_on_server"],
        "turns_no_affinity": plain["conversations"]["turns"],
        "seconds": round(aff["seconds"], 2),
        "seconds_no_affinity": round(plain["seconds"], 2),
        "single_turn_seconds": round(single["seconds"], 2),
        "ceiling_tokens_per_s": round(ceiling, 1),
        "busy_source": "request spans",
        "servers": SERVERS,
        "time_scale": args.time_scale,
        "max_tokens": args.max_tokens,
        "batch": args.batch,
        "median_output_tokens": args.median_output_tokens,
        "tool_call_rate": args.tool_call_rate,
    }))


if __name__ == "__main__":
    main()
