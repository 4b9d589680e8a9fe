"""Benchmark the prepare stage against a plain pandas load + drop_duplicates + split.

    python -m benchmarks.bench_prepare [--rows 1000000] [--shard-size 2000] [--seed 0]

Writes ``--rows`` synthetic rows in the six source datasets' published schemas and file
formats (parquet, JSON Lines, one JSON array) to a temporary directory, once and outside the
timing, split across the kinds in the proportions of the real sets' row counts (every kind
present). Then, each in its own child process so that peak RSS is that process's own:

- ``ours``: ``include.prompts.prepare_prompts`` over the six sources (streamed with pyarrow,
  normalise, filter, dedupe, shuffle, write JSONL shards);
- ``baseline``: the straightforward pandas job: ``read_parquet``/``read_json`` per file, the
  prompt column (first ``human`` value of a conversation through ``Series.apply``),
  ``drop_duplicates`` on the prompt text across all sources, a seeded shuffle, JSONL shards of
  the same size.

Prints a table, then one JSON object on the last line (``bench``, ``rows``, ``seconds``,
``prompts_per_s``, ``peak_rss_mb`` (the stage's process plus its worker, if it started one),
``baseline_seconds``, ``baseline_peak_rss_mb``,
``speedup`` = baseline_seconds / seconds, ...). ``prompts_per_s`` counts source rows
processed (extracted, checked and deduplicated) per second of the stage.

The two jobs are not identical: ours also normalises text for dedupe (so whitespace variants
of a prompt are caught), keeps system turns, counts every drop, writes ids and metadata and a
manifest. The baseline is the floor a plain dataframe job sets, which the stage must not lose
to.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Published row counts (shared/docs/datasets.md); the benchmark keeps their proportions.
REAL_COUNTS = {
    "infinity_instruct": 659_808,
    "webinstructsub": 2_335_220,
    "codefeedback": 156_526,
    "metamathqa": 395_000,
    "hermes_function_calling": 11_578,
    "agentinstruct": 1_866,
}
#: Share of rows repeating an earlier prompt of the same source, and of another source.
DUP_SHARE = {
    "infinity_instruct": 0.06,
    "webinstructsub": 0.04,
    "codefeedback": 0.05,
    "metamathqa": 0.25,  # rephrasings repeat queries
    "hermes_function_calling": 0.40,  # configs share prompts; glaive has duplicate groups
    "agentinstruct": 0.02,
}
CROSS_SHARE = 0.02
#: Of the duplicates, the share that differs only in white space (caught after normalising).
WHITESPACE_VARIANT_SHARE = 0.15
#: Median and spread of prompt / answer lengths in words (log-normal, clipped).
PROMPT_WORDS = {"median": 27, "sigma": 0.9, "lo": 3, "hi": 2000}
CODE_PROMPT_WORDS = {"median": 60, "sigma": 0.9, "lo": 5, "hi": 3000}
ANSWER_WORDS = {"median": 110, "sigma": 0.8, "lo": 5, "hi": 3000}
NON_ASCII_WORD_SHARE = 0.02
ROW_GROUP = 20_000
WIS_ROWS_PER_FILE = 180_000  # the real set is 13 files of ~180k rows
RSS_TARGET_MB = 2048


def split_rows(total: int) -> dict[str, int]:
    """Return rows per kind: the real proportions scaled to ``total``, each kind >= 1."""
    kinds = list(REAL_COUNTS)
    if total < len(kinds):
        raise SystemExit(f"--rows must be at least {len(kinds)} (one per kind)")
    real = sum(REAL_COUNTS.values())
    exact = {k: total * REAL_COUNTS[k] / real for k in kinds}
    counts = {k: max(1, int(exact[k])) for k in kinds}
    # Largest remainder, taking from the biggest kind if the minimum of 1 overshot.
    by_remainder = sorted(kinds, key=lambda k: exact[k] - int(exact[k]), reverse=True)
    i = 0
    while sum(counts.values()) < total:
        counts[by_remainder[i % len(kinds)]] += 1
        i += 1
    while sum(counts.values()) > total:
        counts[max(counts, key=counts.get)] -= 1  # type: ignore[arg-type]
    return counts


# ---------------------------------------------------------------------------------------
# Data generation (outside the timing): columns built with numpy slices of one word corpus.


class _Corpus:
    """One long random text; a prompt is a slice of whole words at a random place."""

    def __init__(self, rng: Any, n_words: int) -> None:
        import numpy as np

        from synthetic_sources import _WORDS

        ascii_words = np.array(_WORDS)
        other = np.array(["naïve", "résumé", "数学", "函数", "计算", "Ｃａｆé", "x²", "≤", "∑"])
        words = ascii_words[rng.integers(0, len(ascii_words), n_words)]
        # Some words in non-ASCII text (accents, CJK, maths symbols, full-width forms): about
        # 40% of median-length prompts hold one, long prompts nearly always.
        where = np.flatnonzero(rng.random(n_words) < NON_ASCII_WORD_SHARE)
        words[where] = other[rng.integers(0, len(other), len(where))]
        self.text = " ".join(words.tolist())
        ends = np.cumsum(np.char.str_len(words) + 1)
        self.offsets = np.concatenate([[0], ends])
        self.n_words = n_words

    def texts(self, rng: Any, n: int, lengths: dict[str, float], end: str) -> list[str]:
        import numpy as np

        k = rng.lognormal(math.log(lengths["median"]), lengths["sigma"], n).astype(np.int64)
        k = np.clip(k, lengths["lo"], lengths["hi"])
        start = rng.integers(0, self.n_words - int(lengths["hi"]) - 1, n)
        a = self.offsets[start].tolist()
        b = (self.offsets[start + k] - 1).tolist()
        t = self.text
        return [t[x].upper() + t[x + 1 : y] + end for x, y in zip(a, b, strict=True)]


def _add_duplicates(rng: Any, prompts: list[str], share: float, earlier: list[str]) -> list[str]:
    import numpy as np

    n = len(prompts)
    dup = np.flatnonzero(rng.random(n) < share)
    dup = dup[dup > 0]
    sources = (rng.random(len(dup)) * dup).astype(np.int64)
    variant = rng.random(len(dup)) < WHITESPACE_VARIANT_SHARE
    for i, j, v in zip(dup.tolist(), sources.tolist(), variant.tolist(), strict=True):
        p = prompts[j]
        prompts[i] = (p.replace(" ", "  ", 1) + " ") if v else p
    if earlier:
        cross = np.flatnonzero(rng.random(n) < CROSS_SHARE)
        picks = rng.integers(0, len(earlier), len(cross))
        for i, j in zip(cross.tolist(), picks.tolist(), strict=True):
            prompts[i] = earlier[j]
    return prompts


def _write_table(path: Path, columns: dict[str, Any], traps: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(columns)
    if traps:
        table = pa.concat_tables([table, pa.Table.from_pylist(traps, schema=table.schema)])
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=ROW_GROUP)


def generate(directory: Path, total: int, seed: int) -> list[dict[str, Any]]:
    """Write the six sources under ``directory``; return their settings and formats."""
    import numpy as np

    from synthetic_sources import TRAPS, rows, write_json_array, write_jsonl, write_parquet

    counts = split_rows(total)
    rng = np.random.default_rng(seed)
    corpus = _Corpus(rng, max(200_000, min(total * 4, 4_000_000)))
    earlier: list[str] = []

    def prompts(kind: str, n: int, lengths: dict[str, float] = PROMPT_WORDS) -> list[str]:
        out = _add_duplicates(rng, corpus.texts(rng, n, lengths, "?"), DUP_SHARE[kind], earlier)
        earlier.extend(out[: min(n, 50_000)])
        return out

    def answers(n: int) -> list[str]:
        return corpus.texts(rng, n, ANSWER_WORDS, ".")

    def choice(values: list[str], n: int) -> list[str]:
        return [values[i] for i in rng.integers(0, len(values), n).tolist()]

    def traps(kind: str, n: int) -> tuple[int, list[dict[str, Any]]]:
        t = [r for r, _ in TRAPS.get(kind, [])]
        return (n - len(t), t) if n > 2 * len(t) else (n, [])

    sources: list[dict[str, Any]] = []
    system = "You are a helpful assistant."

    # Infinity-Instruct 0625: parquet, `conversations` list of {from, value}.
    n, trap_rows = traps("infinity_instruct", counts["infinity_instruct"])
    ps, ans, more = prompts("infinity_instruct", n), answers(n), rng.random((n, 2))
    follow = corpus.texts(rng, n, {"median": 8, "sigma": 0.5, "lo": 2, "hi": 50}, "?")
    convs = []
    for i in range(n):
        conv = [{"from": "system", "value": system}] if more[i, 0] < 0.1 else []
        conv += [{"from": "human", "value": ps[i]}, {"from": "gpt", "value": ans[i]}]
        if more[i, 1] < 0.2:
            conv += [{"from": "human", "value": follow[i]}, {"from": "gpt", "value": follow[i]}]
        convs.append(conv)
    abilities = choice(["math", "coding", "reasoning", "writing"], n)
    path = directory / "infinity_instruct_0625.parquet"
    _write_table(
        path,
        {
            "id": [str(i) for i in range(n)],
            "conversations": convs,
            "label": [
                {"ability_en": [a], "ability_zh": [], "cate_ability_en": [], "cate_ability_zh": []}
                for a in abilities
            ],
            "langdetect": ["zh" if x < 0.15 else "en" for x in rng.random(n).tolist()],
            "source": choice(["Subjective", "code_exercises", "MetaMath", "flan"], n),
        },
        trap_rows,
    )
    del convs, ps, ans, follow
    sources.append(
        {
            "name": "infinity_instruct",
            "kind": "infinity_instruct",
            "config": "0625",
            "path": str(path),
            "format": "parquet",
            "prompt": "conversations",
        }
    )

    # WebInstructSub: parquet in several files, flat `question`.
    n, trap_rows = traps("webinstructsub", counts["webinstructsub"])
    ps, ans = prompts("webinstructsub", n), answers(n)
    src = choice(["mathstackexchange", "stackexchange", "socratic"], n)
    wis = directory / "webinstructsub"
    n_files = max(1, math.ceil(n / WIS_ROWS_PER_FILE))
    per = math.ceil(n / n_files)
    for f in range(n_files):
        lo, hi = f * per, min(n, (f + 1) * per)
        _write_table(
            wis / f"train-{f:05d}-of-{n_files:05d}.parquet",
            {
                "orig_question": ps[lo:hi],
                "question": ps[lo:hi],
                "orig_answer": [a[: len(a) // 2] for a in ans[lo:hi]],
                "answer": ans[lo:hi],
                "index": list(range(lo, hi)),
                "source": src[lo:hi],
            },
            trap_rows if f == n_files - 1 else [],
        )
    del ps, ans, src
    sources.append(
        {
            "name": "webinstructsub",
            "kind": "webinstructsub",
            "path": str(wis),
            "format": "parquet",
            "prompt": "question",
        }
    )

    # CodeFeedback: one JSON Lines file, flat `query`.
    n = counts["codefeedback"]
    ps, ans = prompts("codefeedback", n, CODE_PROMPT_WORDS), answers(n)
    res, lang = (
        choice(["wizardcoder", "sharegpt", "evolinstruct"], n),
        choice(["python", "sql", "javascript"], n),
    )
    path = directory / "codefeedback.jsonl"
    write_jsonl(
        path,
        [
            {"query": q, "answer": a, "resource": r, "lang": g}
            for q, a, r, g in zip(ps, ans, res, lang, strict=True)
        ],
    )
    sources.append(
        {
            "name": "codefeedback",
            "kind": "codefeedback",
            "path": str(path),
            "format": "jsonl",
            "prompt": "query",
        }
    )

    # MetaMathQA: ONE JSON array, flat `query`.
    n = counts["metamathqa"]
    ps, ans = prompts("metamathqa", n), answers(n)
    typ = choice(["GSM_AnsAug", "MATH_Rephrased", "GSM_SV", "MATH_FOBAR"], n)
    path = directory / "MetaMathQA-395K.json"
    write_json_array(
        path,
        [
            {"query": q, "response": a, "original_question": q, "type": t}
            for q, a, t in zip(ps, ans, typ, strict=True)
        ],
    )
    sources.append(
        {
            "name": "metamathqa",
            "kind": "metamathqa",
            "path": str(path),
            "format": "json",
            "prompt": "query",
        }
    )

    # Hermes function calling and AgentInstruct: small, from the reference generators.
    n, trap_rows = traps("hermes_function_calling", counts["hermes_function_calling"])
    hermes = list(rows("hermes_function_calling", n, seed, DUP_SHARE["hermes_function_calling"]))
    path = directory / "hermes_func_calling.json"
    write_json_array(path, hermes + trap_rows)
    sources.append(
        {
            "name": "hermes_fc",
            "kind": "hermes_function_calling",
            "config": "func_calling",
            "path": str(path),
            "format": "json",
            "prompt": "conversations",
        }
    )
    path = directory / "agentinstruct_os.parquet"
    write_parquet(
        path, list(rows("agentinstruct", counts["agentinstruct"], seed, DUP_SHARE["agentinstruct"]))
    )
    sources.append(
        {
            "name": "agentinstruct",
            "kind": "agentinstruct",
            "config": "os",
            "path": str(path),
            "format": "parquet",
            "prompt": "conversations",
        }
    )
    for s in sources:
        s["rows"] = counts[_KIND_OF[s["name"]]]
    return sources


_KIND_OF = {
    "infinity_instruct": "infinity_instruct",
    "webinstructsub": "webinstructsub",
    "codefeedback": "codefeedback",
    "metamathqa": "metamathqa",
    "hermes_fc": "hermes_function_calling",
    "agentinstruct": "agentinstruct",
}


# ---------------------------------------------------------------------------------------
# The two jobs, each run in a child process.


def _peak_rss_mb() -> float:
    """Return this process's own peak RSS in MiB.

    ``VmHWM`` is the high-water mark of this process's address space since its exec;
    ``getrusage(RUSAGE_SELF).ru_maxrss`` is not usable here because Linux carries it over
    from the parent across fork + exec (a parent holding the generated data would show
    through).
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _workers_peak_rss_mb() -> float:
    """Return the peak RSS in MiB of the worker process the stage spawns (0 if none ran).

    ``RUSAGE_CHILDREN`` holds the largest peak among this process's finished children: the
    stage spawns at most one worker and joins it, so this is that worker's peak (a fresh
    interpreter: it shares no pages with this process).
    """
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux


def run_ours(spec: dict[str, Any]) -> dict[str, Any]:
    """Run ``prepare_prompts`` over the spec's sources; return its figures."""
    import logging

    import datasets  # noqa: F401 - imported before the clock starts, as pandas is below

    from benchmarks.common import bench_settings
    from include.prompts import prepare_prompts
    from include.storage import LocalStore

    logging.basicConfig(level=logging.WARNING)
    settings = bench_settings(
        {
            "sources": [
                {k: v for k, v in s.items() if k in ("name", "kind", "config", "path")}
                for s in spec["sources"]
            ],
            "run_name": "bench",
            "shard_size": spec["shard_size"],
            "seed": spec["seed"],
        },
        output_root=spec["out"],
    )
    start = time.perf_counter()
    manifest = prepare_prompts(settings, LocalStore(settings.run_uri))
    seconds = time.perf_counter() - start
    own, workers = _peak_rss_mb(), _workers_peak_rss_mb()
    return {
        "seconds": seconds,
        "peak_rss_mb": own + workers,
        "peak_rss_main_mb": own,
        "peak_rss_workers_mb": workers,
        "read": manifest["totals"]["read"],
        "kept": manifest["totals"]["kept"],
        "shards": len(manifest["shards"]),
    }


def _first_human(conversation: Any) -> Any:
    for turn in conversation:
        if turn["from"] == "human":
            return turn["value"]
    return None


def run_baseline(spec: dict[str, Any]) -> dict[str, Any]:
    """The straightforward pandas job: load, prompt column, drop_duplicates, shuffle, split."""
    import pandas as pd

    start = time.perf_counter()
    frames = []
    read = 0
    for s in spec["sources"]:
        path = Path(s["path"])
        if s["format"] == "parquet":
            files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
            df = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
        elif s["format"] == "jsonl":
            df = pd.read_json(path, lines=True)
        else:
            df = pd.read_json(path)
        read += len(df)
        col = s["prompt"]
        prompt = df[col].apply(_first_human) if col == "conversations" else df[col]
        frames.append(pd.DataFrame({"source": s["name"], "prompt": prompt}))
        del df
    data = pd.concat(frames, ignore_index=True)
    del frames
    data = data.dropna(subset=["prompt"]).drop_duplicates(subset="prompt")
    data = data.sample(frac=1, random_state=spec["seed"])
    out = Path(spec["out"]) / "baseline"
    out.mkdir(parents=True, exist_ok=True)
    size = spec["shard_size"]
    n_shards = math.ceil(len(data) / size)
    for n in range(n_shards):
        data.iloc[n * size : (n + 1) * size].to_json(
            out / f"shard-{n:05d}.jsonl", orient="records", lines=True, force_ascii=False
        )
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "peak_rss_mb": _peak_rss_mb(),
        "read": read,
        "kept": len(data),
        "shards": n_shards,
    }


def _child(job: str, spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    result = (run_ours if job == "ours" else run_baseline)(spec)
    print(json.dumps(result), flush=True)


def _spawn(job: str, spec: dict[str, Any], work: Path) -> dict[str, Any]:
    for stale in (work / f"out-{job}", work / f"hf-cache-{job}"):
        shutil.rmtree(stale, ignore_errors=True)  # a kept work dir: no cache hit, no no-op
    spec_path = work / f"spec-{job}.json"
    spec = {**spec, "out": str(work / f"out-{job}")}
    spec_path.write_text(json.dumps(spec))
    env = {
        **os.environ,
        "HF_DATASETS_CACHE": str(work / f"hf-cache-{job}"),  # fresh: no cache hit
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TMPDIR": str(work),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench_prepare",
            "--child",
            job,
            "--spec",
            str(spec_path),
        ],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{job} child failed with exit code {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _table(rows: list[tuple[str, str, str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}" for r in rows)


def _reuse(work: Path, rows: int, seed: int) -> list[dict[str, Any]] | None:
    """Return the sources a kept work directory already holds for these rows and seed."""
    listing = work / "data" / "sources.json"
    if not listing.exists():
        return None
    saved = json.loads(listing.read_text())
    if (saved["rows"], saved["seed"]) != (rows, seed):
        shutil.rmtree(work / "data")
        return None
    return saved["sources"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shard-size", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="work in DIR and keep it; its data is reused by a later run with the same --rows "
        "and --seed",
    )
    parser.add_argument("--skip-baseline", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=("ours", "baseline"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.spec)
        return 0

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        sources = _reuse(work, args.rows, args.seed)
        if sources is None:
            sources = generate(work / "data", args.rows, args.seed)
            (work / "data" / "sources.json").write_text(
                json.dumps({"rows": args.rows, "seed": args.seed, "sources": sources})
            )
        gen_seconds = time.perf_counter() - t0
        data_mb = sum(f.stat().st_size for f in (work / "data").rglob("*") if f.is_file()) / 2**20
        print(
            f"generated {args.rows} rows ({data_mb:.0f} MB on disk) in {gen_seconds:.1f} s: "
            + ", ".join(f"{s['name']} {s['rows']} ({s['format']})" for s in sources),
            flush=True,
        )
        spec = {"sources": sources, "shard_size": args.shard_size, "seed": args.seed}
        ours = _spawn("ours", spec, work)
        base = (
            {
                "seconds": float("nan"),
                "peak_rss_mb": float("nan"),
                "read": 0,
                "kept": 0,
                "shards": 0,
            }
            if args.skip_baseline
            else _spawn("baseline", spec, work)
        )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    speedup = base["seconds"] / ours["seconds"]
    print()
    print(
        _table(
            [
                ("", "prepare_prompts", "pandas baseline"),
                ("rows read", str(ours["read"]), str(base["read"])),
                ("prompts kept", str(ours["kept"]), str(base["kept"])),
                ("shards", str(ours["shards"]), str(base["shards"])),
                ("seconds", f"{ours['seconds']:.2f}", f"{base['seconds']:.2f}"),
                (
                    "rows/s",
                    f"{ours['read'] / ours['seconds']:,.0f}",
                    f"{base['read'] / base['seconds']:,.0f}",
                ),
                ("peak RSS (MB)", f"{ours['peak_rss_mb']:.0f}", f"{base['peak_rss_mb']:.0f}"),
                (
                    "  main + worker",
                    f"{ours['peak_rss_main_mb']:.0f} + {ours['peak_rss_workers_mb']:.0f}",
                    "",
                ),
            ]
        )
    )
    print(
        f"speedup (baseline/ours) {speedup:.2f}x; peak RSS target {RSS_TARGET_MB} MB "
        f"{'met' if ours['peak_rss_mb'] <= RSS_TARGET_MB else 'MISSED'}; "
        f"not slower than baseline {'met' if speedup >= 1 else 'MISSED'}"
    )
    result = {
        "bench": "prepare",
        "rows": args.rows,
        "seconds": round(ours["seconds"], 3),
        "prompts_per_s": round(ours["read"] / ours["seconds"], 1),
        "peak_rss_mb": round(ours["peak_rss_mb"], 1),
        "peak_rss_main_mb": round(ours["peak_rss_main_mb"], 1),
        "peak_rss_workers_mb": round(ours["peak_rss_workers_mb"], 1),
        "kept": ours["kept"],
        "shards": ours["shards"],
        "baseline_seconds": round(base["seconds"], 3),
        "baseline_peak_rss_mb": round(base["peak_rss_mb"], 1),
        "baseline_kept": base["kept"],
        "speedup": round(speedup, 3),
        "shard_size": args.shard_size,
        "rss_target_mb": RSS_TARGET_MB,
        "generate_seconds": round(gen_seconds, 1),
        "data_mb": round(data_mb, 1),
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
