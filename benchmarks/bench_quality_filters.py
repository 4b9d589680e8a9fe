"""Precision and recall of the output quality filters on planted failures, and their speed.

Builds a seeded synthetic shard of completion records: clean ones of realistic shapes (prose
and code from text found on this machine, code that repeats lines, markdown and truth tables,
math that repeats symbols, a zero matrix, valid Hermes tool calls, a tool-call example with
broken JSON inside a code fence, bullet lists, short answers that coincide across prompts,
thinking-off answers) and planted failures of every filter's kind (tail loops cut by
max_tokens or stopped, a loop the model broke out of, character loops; unclosed thinking;
empty answers; broken tool-call JSON; one template answer, lightly varied, given to many
prompts). Runs ``include.quality.filter_records`` and prints precision/recall per filter.

Throughput: the filters over the parsed records against a baseline measured in the same run,
``json.loads`` of the same records' JSONL lines (the least the stage does with a record).
Best of ``--rounds`` each, interleaved. Also runs the filters over the demo's completions
under ``var/demo/*/generated/`` when present (rows flagged there are false positives: the
stand-in's text has none of these failures). Last line: one JSON object.

Run: ``python -m benchmarks.bench_quality_filters [--records 3000] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import glob
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.bench_tokenize import _corpus

ROOT = Path(__file__).resolve().parents[1]
FILTERS = ("degenerate_repetition", "unclosed_think", "empty_answer", "invalid_tool_call_json",
           "near_duplicate")


class Maker:
    """Seeded builders of completion texts; each returns (text, finish_reason, expected)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        prose, code = _corpus()
        # Chunks are cut anywhere: a fence cut in half would pair with the wrong one.
        for tag in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_end|>", "```"):
            prose, code = prose.replace(tag, ""), code.replace(tag, "")
        self.prose, self.code = prose, code

    def chunk(self, src: str, lo: int, hi: int) -> str:
        n = self.rng.randint(lo, hi)
        start = self.rng.randrange(0, len(src) - n)
        return src[start: start + n].strip()

    def word(self) -> str:
        """Return a random identifier-like word of the prose."""
        words = self.chunk(self.prose, 40, 80).split()
        return next((w for w in words if w.isalpha() and len(w) > 3), "value").lower()

    def think(self, answer: str) -> str:
        return f"<think>\n{self.chunk(self.prose, 300, 3000)}\n</think>\n\n{answer}"

    # --- clean shapes -------------------------------------------------------------------
    def clean(self, kind: str) -> str:
        """Return a clean answer of ``kind``: its own words (answers to different prompts
        differ), around the shape that repeats."""
        body = self._shape(kind)
        if kind in ("short", "tool_call"):
            return body
        return f"{self.chunk(self.prose, 40, 300)}\n\n{body}"

    def _shape(self, kind: str) -> str:
        r = self.rng
        if kind == "prose":
            return self.chunk(self.prose, 200, 4000)
        if kind == "code":
            return "```python\n" + self.chunk(self.code, 300, 4000) + "\n```"
        if kind == "code_repeats":  # tests repeat their assertion lines
            name, base = self.word(), r.randint(0, 10**6)
            lines = [f"    assert {name}({base + i}, {i + 1}) == expected[{base + i}]"
                     for i in range(r.randint(10, 40))]
            sep = ['    print("-" * 40)'] * r.randint(3, 8)
            return (f"```python\ndef test_{name}():\n" + "\n".join(lines + sep)
                    + f"\n```\n{self.chunk(self.prose, 30, 300)}")
        if kind == "table":
            cols = r.randint(3, 6)
            head = "| " + " | ".join(f"col{c}" for c in range(cols)) + " |"
            rows = ["| " + " | ".join(str(r.choice([0, 0, 1, r.randint(0, 99)]))
                                      for _ in range(cols)) + " |"
                    for _ in range(r.randint(8, 40))]
            return "Here is the table:\n\n" + "\n".join(
                [head, "|" + "---|" * cols, *rows]) + "\n\nTotals are in the last column."
        if kind == "truth_table":
            n = r.choice([3, 4])
            rows = ["| " + " | ".join("T" if (i >> b) & 1 else "F" for b in range(n)) + " | "
                    + r.choice("TF") + " |" for i in range(2**n)]
            return ("| " + " | ".join("pqrs"[:n]) + " | out |\n|" + "---|" * (n + 1) + "\n"
                    + "\n".join(rows))
        if kind == "math":
            k = r.randint(5, 30)
            return ("We expand: $$" + " + ".join(["x"] * k) + f" = {k}x$$ and "
                    + "$$" + r" \cdot ".join(["2"] * k) + f" = 2^{{{k}}}$$. So the answer is "
                    + rf"$\boxed{{{k}}}$.")
        if kind == "zero_matrix":
            n = r.randint(4, 12)
            row = " & ".join(["0"] * n) + r" \\"
            return (r"The zero matrix: $$\begin{pmatrix}" + "\n" + "\n".join([row] * n)
                    + "\n" + r"\end{pmatrix}$$" + "\nEvery product with it is zero.")
        if kind == "tool_call":
            calls = [json.dumps({"name": r.choice(["get_weather", "search", "book_flight"]),
                                 "arguments": {"city": self.chunk(self.prose, 5, 20),
                                               "days": r.randint(1, 9)}})
                     for _ in range(r.randint(1, 3))]
            return "\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in calls)
        if kind == "tool_example":  # a broken call shown as an example, inside a fence
            return (f"{self.chunk(self.prose, 30, 400)}\nThe format is:\n```\n<tool_call>\n"
                    f"{{name: '{self.word()}', arguments: ...}}\n</tool_call>\n```\n"
                    f"{self.chunk(self.prose, 30, 400)}")
        if kind == "list":
            return "Steps:\n" + "\n".join(
                f"- Step {i}: check the {self.word()} and record it."
                for i in range(1, r.randint(5, 30)))
        if kind == "short":
            return r.choice(["4", "Yes.", "No.", "The answer is 12.", r"$\boxed{7}$", "True"])
        raise ValueError(kind)

    # --- planted failures ---------------------------------------------------------------
    def loop(self) -> tuple[str, str]:
        r = self.rng
        style = r.choice(["tail_length", "tail_stop", "recovered", "chars"])
        if style == "chars":
            return self.chunk(self.prose, 100, 800) + r.choice(["!", "的", "ab", "\n"]) * \
                r.randint(700, 3000), "length"
        # A phrase or a sentence (a loop of one or two words is a character loop, above).
        unit = self.chunk(self.prose, 25, 160) + r.choice([" ", "\n", ". "])
        reps = r.randint(max(8, 1200 // len(unit)), max(12, 6000 // len(unit)))
        if style == "recovered":  # a loop in the thinking, then an answer
            body = self.chunk(self.prose, 200, 1500) + " " + unit * reps
            return f"<think>\n{body}\n</think>\n\n{self.chunk(self.prose, 100, 600)}", "stop"
        text = self.think(self.chunk(self.prose, 50, 500) + " " + unit * reps)
        if style == "tail_length":
            return text[: len(text) - r.randint(0, len(unit) - 1)], "length"
        return text, "stop"

    def unclosed(self) -> str:
        return "<think>\n" + self.chunk(self.prose, 100, 3000)

    def empty(self) -> str:
        return f"<think>\n{self.chunk(self.prose, 100, 2000)}\n</think>" + self.rng.choice(
            ["", "\n\n", "  \n", "\n"])

    def bad_tool(self) -> str:
        good = {"name": "get_weather", "arguments": {"city": "Paris"}}
        body = self.rng.choice([
            json.dumps(good)[:-2],  # cut
            json.dumps(good).replace('"city"', "'city'"),  # single quotes
            json.dumps(good)[:-1] + ",}",  # trailing comma
            json.dumps({"arguments": {"city": "Paris"}}),  # no name
            json.dumps({"name": "get_weather", "arguments": ["Paris"]}),  # list arguments
            json.dumps([good]),  # a list
        ])
        return f"<tool_call>\n{body}\n</tool_call>"


CLEAN_KINDS = ("prose", "code", "code_repeats", "table", "truth_table", "math", "zero_matrix",
               "tool_call", "tool_example", "list", "short")


def build(count: int, seed: int) -> tuple[list[dict[str, Any]], list[str | None]]:
    """Return ``count`` records in shard order and the reason each should get (None: clean)."""
    m = Maker(seed)
    rng = m.rng
    records: list[dict[str, Any]] = []
    expected: list[str | None] = []
    templates = [m.chunk(m.prose, 400, 1200) for _ in range(8)]

    def add(text: str, finish: str, want: str | None, thinking: bool = True,
            kind: str | None = None) -> None:
        i = len(records)
        records.append({
            "id": f"bench:default:{i}", "source": "bench", "status": "completed",
            "messages": [{"role": "user", "content": f"prompt {i}: {m.chunk(m.prose, 30, 200)}"}],
            "text": text, "finish_reason": finish,
            "sampling": {"enable_thinking": thinking, "temperature": 0.6},
            "metadata": {"kind": kind or want},
        })
        expected.append(want)

    seen_template: set[int] = set()
    for _ in range(count):
        roll = rng.random()
        if roll < 0.70:
            kind = rng.choice(CLEAN_KINDS)
            thinking = rng.random() < 0.8
            answer = m.clean(kind)
            add(m.think(answer) if thinking else answer, "stop", None, thinking, kind)
        elif roll < 0.76:
            text, finish = m.loop()
            add(text, finish, "degenerate_repetition")
        elif roll < 0.82:
            add(m.unclosed(), "stop", "unclosed_think")
        elif roll < 0.88:
            add(m.empty(), "stop", "empty_answer")
        elif roll < 0.94:
            add(m.think(m.bad_tool()), "stop", "invalid_tool_call_json")
        else:  # a template answer: the first of each kept, the later ones near-duplicates
            t = rng.randrange(len(templates))
            words = templates[t].split()
            for _ in range(rng.randint(0, 2)):  # light variation: a word changed
                words[rng.randrange(len(words))] = rng.choice(["indeed", "also", "here"])
            add(m.think(" ".join(words)), "stop",
                "near_duplicate" if t in seen_template else None, kind="template")
            seen_template.add(t)
    return records, expected


def scores(records: list[dict[str, Any]], expected: list[str | None],
           quarantined: list[dict[str, str]]) -> dict[str, dict[str, float]]:
    """Return precision, recall and counts per filter."""
    got = {q["id"]: q["reason"] for q in quarantined}
    out = {}
    for f in FILTERS:
        tp = sum(1 for r, e in zip(records, expected, strict=True)
                 if e == f and got.get(r["id"]) == f)
        flagged = sum(1 for reason in got.values() if reason == f)
        planted = sum(1 for e in expected if e == f)
        out[f] = {"planted": planted, "flagged": flagged, "true_positive": tp,
                  "precision": round(tp / flagged, 4) if flagged else 1.0,
                  "recall": round(tp / planted, 4) if planted else 1.0}
    clean = [r["id"] for r, e in zip(records, expected, strict=True) if e is None]
    out["clean"] = {"rows": len(clean), "flagged": sum(1 for i in clean if i in got)}
    return out


def demo_check() -> dict[str, Any] | None:
    """Return what the filters flag in the demo's completions (None: no demo output here)."""
    from include.quality import QualityOptions, filter_records

    files = sorted(glob.glob(str(ROOT / "var" / "demo" / "*" / "generated" / "shard-*.jsonl")))
    if not files:
        return None
    flagged: Counter[str] = Counter()
    rows = 0
    for f in files:  # per shard, as the stage runs them
        recs = [json.loads(line) for line in Path(f).read_text().splitlines() if line.strip()]
        rows += len(recs)
        flagged.update(q["reason"] for q in filter_records(recs, QualityOptions(
            check_truncated=True))[1])
    return {"shards": len(files), "rows": rows, "flagged": dict(flagged)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from include.quality import QualityOptions, filter_records

    records, expected = build(args.records, args.seed)
    lines = [json.dumps(r) for r in records]
    options = QualityOptions(check_truncated=True)
    best = {"filters": float("inf"), "json": float("inf")}
    for _ in range(args.rounds):
        t = time.perf_counter()
        _, quarantined = filter_records(records, options)
        best["filters"] = min(best["filters"], time.perf_counter() - t)
        t = time.perf_counter()
        for line in lines:
            json.loads(line)
        best["json"] = min(best["json"], time.perf_counter() - t)
    result = scores(records, expected, quarantined)
    print(f"{'filter':<24} {'planted':>7} {'flagged':>7} {'precision':>9} {'recall':>7}",
          file=sys.stderr)
    for f in FILTERS:
        s = result[f]
        print(f"{f:<24} {s['planted']:>7} {s['flagged']:>7} {s['precision']:>9.4f} "
              f"{s['recall']:>7.4f}", file=sys.stderr)
    print(f"clean rows {result['clean']['rows']}, flagged {result['clean']['flagged']}",
          file=sys.stderr)
    got = {q["id"]: q for q in quarantined}
    for r, e in zip(records, expected, strict=True):  # what went wrong, to tune by
        q = got.get(r["id"])
        if (q and q["reason"]) != e:
            said = f"{q['reason']}: {q['detail']}" if q else "kept"
            print(f"  {r['id']} ({r['metadata']['kind']}, expected {e}): {said}",
                  file=sys.stderr)
    demo = demo_check()
    megabytes = sum(map(len, lines)) / 1e6
    out = {
        "bench": "quality_filters",
        "records": len(records),
        "megabytes": round(megabytes, 2),
        "per_filter": {f: {k: result[f][k] for k in ("planted", "flagged", "precision",
                                                     "recall")} for f in FILTERS},
        "clean_rows": result["clean"]["rows"],
        "clean_rows_flagged": result["clean"]["flagged"],
        "records_per_s": round(len(records) / best["filters"]),
        "megabytes_per_s": round(megabytes / best["filters"], 1),
        "baseline_json_records_per_s": round(len(records) / best["json"]),
        "ratio_to_json_parse": round(best["json"] / best["filters"], 3),
        "filters_s": round(best["filters"], 3),
        "json_s": round(best["json"], 3),
        "demo": demo,
    }
    print(f"filters {out['records_per_s']} records/s ({out['megabytes_per_s']} MB/s); "
          f"json.loads {out['baseline_json_records_per_s']} records/s; demo {demo}")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
