"""The six sources at their published sizes, or a fraction of them, written a chunk at a time.

For benchmarks only. Rows follow the published schemas and file layouts
(``shared/docs/datasets.md``); there are as many as published and about as many bytes on
disk (issue 14: 3.55M rows, ~9 GB). Text is cut from one random word corpus with numpy, and
each file is written in chunks, so 9 GB are written in minutes with little memory. Prompts
repeat within a source (some only in white space) and across sources, and the documented trap
rows are there.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from synthetic_sources import _WORDS, TRAPS, rows

#: Rows and megabytes on disk as published (issue 14). The two small sets' bytes are not aimed
#: at: their rows come from the per-row generators as they are.
PUBLISHED: dict[str, tuple[int, float]] = {
    "infinity_instruct": (659_808, 2200),
    "webinstructsub": (2_335_220, 6200),
    "codefeedback": (156_526, 371),
    "metamathqa": (395_000, 396),
    "hermes_function_calling": (11_578, 0),
    "agentinstruct": (1_866, 0),
}
#: Hermes Function Calling v1's five configs and THUDM/AgentInstruct's six splits, in rows.
HERMES_CONFIGS = {
    "func_calling_singleturn": 1_893,
    "func_calling": 1_893,
    "glaive_function_calling_5k": 5_209,
    "json_mode_agentic": 1_342,
    "json_mode_singleturn": 1_241,
}
AGENT_SPLITS = {"os": 195, "db": 538, "alfworld": 336, "webshop": 351, "kg": 324, "mind2web": 122}
#: Share of rows repeating an earlier prompt of the same source, and of an earlier source.
DUP_SHARE = {
    "infinity_instruct": 0.06,
    "webinstructsub": 0.04,
    "codefeedback": 0.05,
    "metamathqa": 0.25,  # rephrasings repeat queries
}
CROSS_SHARE = 0.02
WHITESPACE_VARIANT_SHARE = 0.15
#: Prompt lengths in words: log-normal (median, sigma), clipped to [lo, hi].
PROMPT_WORDS = (27, 0.9, 3, 2000)
CODE_PROMPT_WORDS = (60, 0.9, 5, 3000)
CHUNK_ROWS = 20_000  # also the parquet row group
_POOL = 50_000  # earlier prompts kept to repeat


class _Text:
    """One long random text; a prompt or an answer is a slice of whole words of it."""

    def __init__(self, rng: Any, n_words: int = 4_000_000) -> None:
        import numpy as np

        plain = np.array(_WORDS)
        other = np.array(["naïve", "résumé", "数学", "函数", "计算", "Ｃａｆé", "x²", "≤", "∑"])
        words = plain[rng.integers(0, len(plain), n_words)]
        where = np.flatnonzero(rng.random(n_words) < 0.02)  # some non-ASCII words
        words[where] = other[rng.integers(0, len(other), len(where))]
        self.text = " ".join(words.tolist())
        self.offsets = np.concatenate([[0], np.cumsum(np.char.str_len(words) + 1)])
        self.n_words = n_words
        self.rng = rng

    def cut(self, n: int, words: tuple[float, float, int, int], end: str) -> list[str]:
        import numpy as np

        median, sigma, lo, hi = words
        hi = min(int(hi), self.n_words // 2)
        k = np.clip(self.rng.lognormal(math.log(median), sigma, n).astype(np.int64), lo, hi)
        start = self.rng.integers(0, self.n_words - hi - 1, n)
        a = self.offsets[start].tolist()
        b = (self.offsets[start + k] - 1).tolist()
        t = self.text
        return [t[x].upper() + t[x + 1 : y] + end for x, y in zip(a, b, strict=True)]


class _Prompts:
    """Prompts with repeats: of the same source (some only in white space), of earlier ones."""

    def __init__(self, text: _Text) -> None:
        self.text = text
        self.earlier: list[str] = []  # from earlier sources
        self.pool: list[str] = []  # from this source

    def start(self) -> None:
        self.earlier = (self.earlier + self.pool)[-_POOL:]
        self.pool = []

    def take(self, n: int, share: float, words: tuple[float, float, int, int]) -> list[str]:
        rng = self.text.rng
        out = self.text.cut(n, words, "?")
        for i, (dup, variant, cross, pick) in enumerate(rng.random((n, 4)).tolist()):
            if self.pool and dup < share:
                p = self.pool[int(pick * len(self.pool))]
                spaced = variant < WHITESPACE_VARIANT_SHARE
                out[i] = (p.replace(" ", "  ", 1) + " ") if spaced else p
            elif self.earlier and cross < CROSS_SHARE:
                out[i] = self.earlier[int(pick * len(self.earlier))]
        self.pool = (self.pool + out[: _POOL // 4])[-_POOL:]
        return out


class _Sizer:
    """Steers answer lengths so a file's bytes per row approach the published ones."""

    def __init__(self, median_words: float, target_bytes_per_row: float) -> None:
        self.median = median_words
        self.target = target_bytes_per_row

    def words(self) -> tuple[float, float, int, int]:
        return (max(5.0, self.median), 0.8, 5, 6000)

    def written(self, bytes_per_row: float) -> None:
        if self.target and bytes_per_row:
            self.median *= min(3.0, max(0.33, self.target / bytes_per_row))


def _parquet(path: Path, chunks: Iterator[dict[str, list]], sizer: _Sizer | None,
             traps: list[dict[str, Any]] | None = None) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = None
    written = 0
    try:
        for columns in chunks:
            table = pa.table(columns, schema=writer.schema if writer else None)
            writer = writer or pq.ParquetWriter(path, table.schema)
            before = os.path.getsize(path)
            writer.write_table(table, row_group_size=CHUNK_ROWS)
            written += table.num_rows
            if sizer:
                sizer.written((os.path.getsize(path) - before) / table.num_rows)
        if traps and writer:
            writer.write_table(pa.Table.from_pylist(traps, schema=writer.schema))
            written += len(traps)
    finally:
        if writer:
            writer.close()
    return written


def _json_rows(path: Path, records: Iterator[list[dict]], array: bool, sizer: _Sizer | None
               ) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(path, "w", encoding="utf-8") as fh:
        if array:
            fh.write("[")
        for chunk in records:
            before = fh.tell()
            if array:  # indented as write_json_array writes it
                items = [json.dumps(r, ensure_ascii=False, indent=1) for r in chunk]
                fh.write(("," if written else "") + "\n" + ",\n".join(items))
            else:
                fh.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in chunk))
            written += len(chunk)
            if sizer:
                sizer.written((fh.tell() - before) / len(chunk))
        if array:
            fh.write("\n]\n")
    return written


def _chunks(n: int) -> Iterator[int]:
    for lo in range(0, n, CHUNK_ROWS):
        yield min(CHUNK_ROWS, n - lo)


def write_published(directory: Path, scale: float = 1.0, seed: int = 0,
                    log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Write every source, scaled, under ``directory``; return one entry per source.

    An entry holds the source's run settings (``name``, ``kind``, ``config``, ``path``,
    ``multi_turn``) and, for a baseline job, its ``format`` (parquet, jsonl, json), ``prompt``
    column and ``rows``.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    text = _Text(rng)
    prompts = _Prompts(text)
    d = Path(directory)
    out: list[dict[str, Any]] = []

    def n_rows(kind: str) -> int:
        return max(1, round(PUBLISHED[kind][0] * scale))

    def sizer(kind: str, median: float) -> _Sizer:
        rows_, mb = PUBLISHED[kind]
        return _Sizer(median, mb * 1e6 / rows_)

    def choice(values: list[str], n: int) -> list[str]:
        return [values[i] for i in rng.integers(0, len(values), n).tolist()]

    # Infinity-Instruct 0625: parquet files, `conversations` list of {from, value}.
    n = n_rows("infinity_instruct") - len(TRAPS["infinity_instruct"])
    s = sizer("infinity_instruct", 450)
    prompts.start()

    def ii_chunks(lo: int, hi: int) -> Iterator[dict[str, list]]:
        for k in _chunks(hi - lo):
            ps, ans = prompts.take(k, DUP_SHARE["infinity_instruct"], PROMPT_WORDS), text.cut(
                k, s.words(), "."
            )
            follow = text.cut(k, (8, 0.5, 2, 50), "?")
            more = rng.random((k, 2)).tolist()
            convs = []
            for i in range(k):
                conv = []
                if more[i][0] < 0.1:
                    conv.append({"from": "system", "value": "You are a helpful assistant."})
                conv += [{"from": "human", "value": ps[i]}, {"from": "gpt", "value": ans[i]}]
                if more[i][1] < 0.2:
                    conv += [{"from": "human", "value": follow[i]},
                             {"from": "gpt", "value": ans[i][: len(ans[i]) // 3]}]
                convs.append(conv)
            yield {
                "id": [str(lo + i) for i in range(k)],
                "conversations": convs,
                "label": [{"ability_en": [a], "ability_zh": [], "cate_ability_en": [],
                           "cate_ability_zh": []}
                          for a in choice(["math", "coding", "reasoning", "writing"], k)],
                "langdetect": ["zh" if x < 0.15 else "en" for x in rng.random(k).tolist()],
                "source": choice(["Subjective", "code_exercises", "MetaMath", "flan"], k),
            }
            lo += k

    ii = d / "infinity_instruct" / "0625"
    files = max(1, math.ceil(n / 200_000))
    for f in range(files):
        lo, hi = f * n // files, (f + 1) * n // files
        traps = [r for r, _ in TRAPS["infinity_instruct"]] if f == files - 1 else []
        _parquet(ii / f"train-{f:05d}-of-{files:05d}.parquet", ii_chunks(lo, hi), s, traps)
    out.append({"name": "infinity_instruct", "kind": "infinity_instruct", "config": "0625",
                "path": str(ii), "format": "parquet", "prompt": "conversations",
                "rows": n + len(TRAPS["infinity_instruct"])})
    log(f"wrote infinity_instruct: {out[-1]['rows']} rows")

    # WebInstructSub: 13 parquet files, flat `question`.
    n = n_rows("webinstructsub") - len(TRAPS["webinstructsub"])
    s = sizer("webinstructsub", 300)
    prompts.start()

    def wis_chunks(lo: int, hi: int) -> Iterator[dict[str, list]]:
        for k in _chunks(hi - lo):
            ps, ans = prompts.take(k, DUP_SHARE["webinstructsub"], PROMPT_WORDS), text.cut(
                k, s.words(), "."
            )
            yield {
                "orig_question": ps,
                "question": ps,
                "orig_answer": [a[: len(a) // 2] for a in ans],
                "answer": ans,
                "index": list(range(lo, lo + k)),
                "source": choice(["mathstackexchange", "stackexchange", "socratic"], k),
            }
            lo += k

    wis = d / "webinstructsub" / "data"
    for f in range(13):
        lo, hi = f * n // 13, (f + 1) * n // 13
        traps = [r for r, _ in TRAPS["webinstructsub"]] if f == 12 else []
        _parquet(wis / f"train-{f:05d}-of-00013.parquet", wis_chunks(lo, hi), s, traps)
    out.append({"name": "webinstructsub", "kind": "webinstructsub", "path": str(wis),
                "format": "parquet", "prompt": "question",
                "rows": n + len(TRAPS["webinstructsub"])})
    log(f"wrote webinstructsub: {out[-1]['rows']} rows")

    # CodeFeedback: one JSON Lines file, flat `query` (no broken lines: pandas cannot skip them).
    n = n_rows("codefeedback")
    s = sizer("codefeedback", 200)
    prompts.start()

    def cf_chunks() -> Iterator[list[dict]]:
        for k in _chunks(n):
            ps = prompts.take(k, DUP_SHARE["codefeedback"], CODE_PROMPT_WORDS)
            ans = text.cut(k, s.words(), ".")
            res = choice(["wizardcoder", "sharegpt", "evolinstruct"], k)
            lang = choice(["python", "sql", "javascript"], k)
            yield [{"query": q, "answer": a, "resource": r, "lang": g}
                   for q, a, r, g in zip(ps, ans, res, lang, strict=True)]

    path = d / "codefeedback" / "CodeFeedback-Filtered-Instruction.jsonl"
    rows_cf = _json_rows(path, cf_chunks(), False, s)
    out.append({"name": "codefeedback", "kind": "codefeedback", "path": str(path),
                "format": "jsonl", "prompt": "query", "rows": rows_cf})
    log(f"wrote codefeedback: {rows_cf} rows")

    # MetaMathQA: ONE JSON array, flat `query`.
    n = n_rows("metamathqa")
    s = sizer("metamathqa", 45)
    prompts.start()

    def mm_chunks() -> Iterator[list[dict]]:
        for k in _chunks(n):
            ps = prompts.take(k, DUP_SHARE["metamathqa"], PROMPT_WORDS)
            ans = text.cut(k, s.words(), ".")
            typ = choice(["GSM_AnsAug", "MATH_Rephrased", "GSM_SV", "MATH_FOBAR"], k)
            yield [{"query": q, "response": a, "original_question": q, "type": t}
                   for q, a, t in zip(ps, ans, typ, strict=True)]

    path = d / "metamathqa" / "MetaMathQA-395K.json"
    rows_mm = _json_rows(path, mm_chunks(), True, s)
    out.append({"name": "metamathqa", "kind": "metamathqa", "path": str(path),
                "format": "json", "prompt": "query", "rows": rows_mm})
    log(f"wrote metamathqa: {rows_mm} rows")

    # Hermes Function Calling v1: five configs, each one JSON array; the two func_calling
    # configs share their prompts, glaive has duplicate groups.
    shared = None
    for i, (config, published) in enumerate(HERMES_CONFIGS.items()):
        k = max(1, round(published * scale))
        if config in ("func_calling_singleturn", "func_calling"):
            shared = shared or list(rows("hermes_function_calling", k, seed, 0.1))
            records = shared[:k]
        else:
            dup = 0.5 if config.startswith("glaive") else 0.1
            records = list(rows("hermes_function_calling", k, seed + 1 + i, dup))
        path = d / "hermes_function_calling" / f"{config.replace('_', '-')}.json"
        _json_rows(path, iter([records]), True, None)
        out.append({"name": f"hermes_{config}", "kind": "hermes_function_calling",
                    "config": config, "path": str(path), "format": "json",
                    "prompt": "conversations", "rows": len(records)})

    # AgentInstruct: six parquet splits.
    for i, (split, published) in enumerate(AGENT_SPLITS.items()):
        k = max(1, round(published * scale))
        path = d / "agentinstruct" / "data" / f"{split}-00000-of-00001.parquet"
        records = list(rows("agentinstruct", k, seed + 10 + i, 0.02))
        _parquet(path, iter([{c: [r[c] for r in records] for c in records[0]}]), None)
        out.append({"name": f"agentinstruct_{split}", "kind": "agentinstruct", "config": split,
                    "path": str(path), "format": "parquet", "prompt": "conversations",
                    "multi_turn": "until_first_trained_assistant", "rows": k})
    log("wrote hermes_function_calling (5 configs) and agentinstruct (6 splits)")
    return out
