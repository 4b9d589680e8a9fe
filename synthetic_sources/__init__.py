"""Synthetic rows in the six source datasets' exact published schemas, traps included.

For tests, benchmarks and the bundled sample files only; production code never imports this.
The real datasets cannot be downloaded here, so these rows copy their schemas (column names,
nesting, JSON-string columns, role names) and the awkward rows a user meets in them, as listed
in ``shared/docs/datasets.md``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "from",
    "at",
    "or",
    "an",
    "have",
    "not",
    "which",
    "but",
    "they",
    "function",
    "value",
    "list",
    "number",
    "string",
    "table",
    "query",
    "result",
    "sum",
    "prime",
    "matrix",
    "derivative",
    "integral",
    "probability",
    "triangle",
    "circle",
    "python",
    "sql",
    "javascript",
    "server",
    "request",
    "agent",
    "file",
    "directory",
    "shell",
    "command",
    "database",
    "user",
    "order",
    "price",
    "total",
    "average",
    "compute",
    "explain",
    "prove",
    "find",
    "write",
    "solve",
    "show",
    "given",
    "returns",
    "error",
    "loop",
    "array",
    "graph",
    "tree",
    "node",
]


def _sentence(rng: random.Random, n_words: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(max(1, n_words))]
    return " ".join(words).capitalize() + "?"


def _length(rng: random.Random) -> int:
    # Prompt lengths in words are long-tailed: most are short, a few are very long.
    return max(3, min(2000, int(rng.lognormvariate(3.3, 0.9))))


def _text(rng: random.Random, pool: list[str], dup_share: float) -> str:
    if pool and rng.random() < dup_share:
        return rng.choice(pool)
    text = _sentence(rng, _length(rng))
    if len(pool) < 5000:
        pool.append(text)
    return text


def infinity_instruct(rng: random.Random, i: int, pool: list[str], dup: float) -> dict:
    """Return one Infinity-Instruct 0625 row."""
    conv = []
    if rng.random() < 0.1:
        conv.append({"from": "system", "value": "You are a helpful assistant."})
    conv += [
        {"from": "human", "value": _text(rng, pool, dup)},
        {"from": "gpt", "value": _sentence(rng, 20)},
    ]
    if rng.random() < 0.2:
        conv += [
            {"from": "human", "value": _sentence(rng, 8)},
            {"from": "gpt", "value": _sentence(rng, 15)},
        ]
    return {
        "id": str(i),
        "conversations": conv,
        "label": {
            "ability_en": ["math"],
            "ability_zh": [],
            "cate_ability_en": [],
            "cate_ability_zh": [],
        },
        "langdetect": "zh" if rng.random() < 0.15 else "en",
        "source": rng.choice(["Subjective", "code_exercises", "MetaMath", "flan"]),
    }


def webinstructsub(rng: random.Random, i: int, pool: list[str], dup: float) -> dict:
    """Return one WebInstructSub row."""
    q = _text(rng, pool, dup)
    return {
        "orig_question": q,
        "question": q,
        "orig_answer": "A",
        "answer": _sentence(rng, 30),
        "index": i,
        "source": rng.choice(["mathstackexchange", "stackexchange", "socratic"]),
    }


def codefeedback(rng: random.Random, i: int, pool: list[str], dup: float) -> dict:
    """Return one CodeFeedback-Filtered-Instruction row."""
    return {
        "query": _text(rng, pool, dup),
        "answer": _sentence(rng, 40),
        "resource": rng.choice(["wizardcoder", "sharegpt", "evolinstruct"]),
        "lang": rng.choice(["python", "sql", "javascript"]),
    }


def metamathqa(rng: random.Random, i: int, pool: list[str], dup: float) -> dict:
    """Return one MetaMathQA row."""
    q = _text(rng, pool, dup)
    return {
        "query": q,
        "response": _sentence(rng, 30),
        "original_question": q,
        "type": rng.choice(["GSM_AnsAug", "MATH_Rephrased", "GSM_SV", "MATH_FOBAR"]),
    }


_HERMES_SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. <tools> {tools} </tools>"
)
_NO_TOOLS = "You are a helpful assistant, with no access to external functions."


def hermes(rng: random.Random, i: int, pool: list[str], dup: float) -> dict:
    """Return one Hermes Function Calling v1 row (system with tools, human, gpt, tool...)."""
    with_tools = rng.random() > 0.15
    tools = [
        {
            "type": "function",
            "function": {"name": f"get_{rng.choice(_WORDS)}", "parameters": {"type": "object"}},
        }
    ]
    system = _HERMES_SYSTEM.format(tools=json.dumps(tools)) if with_tools else _NO_TOOLS
    conv = [
        {"from": "system", "value": system},
        {"from": "human", "value": _text(rng, pool, dup)},
        {"from": "gpt", "value": "<tool_call>{}</tool_call>"},
        {"from": "tool", "value": "<tool_response>{}</tool_response>"},
        {"from": "gpt", "value": _sentence(rng, 10)},
    ]
    return {
        "id": f"h{i}",
        "conversations": conv,
        "category": "API Call",
        "subcategory": rng.choice(["Weather", "Finance"]),
        "task": _sentence(rng, 4),
        "tools": json.dumps(tools) if with_tools else rng.choice(["[]", "null"]),
    }


def agentinstruct(rng: random.Random, i: int, pool: list[str], dup: float) -> dict:
    """Return one THUDM/AgentInstruct row: instruction, ack, task, then agent turns."""
    conv = [
        {
            "from": "human",
            "loss": False,
            "value": "You are an assistant operating a shell. "
            "Answer with Act: bash or Act: finish.",
        },
        {"from": "gpt", "loss": False, "value": "OK."},
        {"from": "human", "loss": None, "value": "Task: " + _text(rng, pool, dup)},
        {"from": "gpt", "loss": True, "value": "Think: list files.\n\nAct: bash"},
        {"from": "human", "loss": None, "value": "The output of the OS: a.txt"},
        {"from": "gpt", "loss": True, "value": "Act: finish"},
    ]
    return {"conversations": conv, "id": f"os_{i}"}


def orca_agentinstruct(rng: random.Random, i: int, pool: list[str], dup: float) -> dict:
    """Return one microsoft/orca-agentinstruct-1M-v1 row (``messages`` is a JSON string)."""
    msgs = [
        {"role": "system", "content": ""},
        {"role": "user", "content": _text(rng, pool, dup)},
        {"role": "assistant", "content": _sentence(rng, 20)},
    ]
    return {"messages": json.dumps(msgs)}


GENERATORS: dict[str, Callable[[random.Random, int, list[str], float], dict]] = {
    "infinity_instruct": infinity_instruct,
    "webinstructsub": webinstructsub,
    "codefeedback": codefeedback,
    "metamathqa": metamathqa,
    "hermes_function_calling": hermes,
    "agentinstruct": agentinstruct,
    "orca_agentinstruct": orca_agentinstruct,
}


def rows(kind: str, n: int, seed: int = 0, dup_share: float = 0.1) -> Iterator[dict[str, Any]]:
    """Yield ``n`` synthetic rows of ``kind``; about ``dup_share`` repeat an earlier prompt."""
    rng = random.Random(f"{seed}:{kind}")
    pool: list[str] = []
    gen = GENERATORS[kind]
    for i in range(n):
        yield gen(rng, i, pool, dup_share)


#: Awkward rows real users meet, per kind, each with the drop reason it must land under
#: (None: the row is valid and must be kept).
TRAPS: dict[str, list[tuple[dict[str, Any], str | None]]] = {
    "infinity_instruct": [
        (
            {
                "id": "t-empty",
                "conversations": [
                    {"from": "human", "value": "   \n\t"},
                    {"from": "gpt", "value": "x"},
                ],
                "label": None,
                "langdetect": "en",
                "source": "flan",
            },
            "empty",
        ),
        (
            {
                "id": "t-nouser",
                "conversations": [{"from": "gpt", "value": "hello"}],
                "label": None,
                "langdetect": "en",
                "source": "flan",
            },
            "no_user_turn",
        ),
        (
            {
                "id": "t-role",
                "conversations": [
                    {"from": "narrator", "value": "once"},
                    {"from": "human", "value": "hi there friend"},
                ],
                "label": None,
                "langdetect": "en",
                "source": "flan",
            },
            "unknown_role",
        ),
        (
            {
                "id": "t-mixed",
                "conversations": [
                    {"from": "system", "value": "Be brief."},
                    {"from": "user", "value": "Mixed role names ok?"},
                    {"from": "assistant", "value": "yes"},
                ],
                "label": None,
                "langdetect": "en",
                "source": "flan",
            },
            None,
        ),
        (
            {
                "id": "t-unicode",
                "conversations": [
                    {"from": "human", "value": "Ｃａｆé\u200b naïve 数学 🙂 test prompt"}
                ],
                "label": None,
                "langdetect": "en",
                "source": "flan",
            },
            None,
        ),
        (
            {
                "id": "t-zh",
                "conversations": [{"from": "human", "value": "计算一加一等于几"}],
                "label": None,
                "langdetect": "zh",
                "source": "flan",
            },
            None,
        ),
    ],
    "webinstructsub": [
        (
            {
                "orig_question": "q",
                "question": "What is the socratic answer here?",
                "orig_answer": "a",
                "answer": "a",
                "index": 10_000_001,
                "source": "socratic",
            },
            "filtered_source",
        ),
        (
            {
                "orig_question": "q",
                "question": "",
                "orig_answer": "a",
                "answer": "a",
                "index": 10_000_002,
                "source": "stackexchange",
            },
            "empty",
        ),
    ],
    "hermes_function_calling": [
        (
            {
                "id": "t-null-tools",
                "conversations": [
                    {"from": "system", "value": _NO_TOOLS},
                    {"from": "human", "value": "Tell me a joke about tools being null"},
                    {"from": "gpt", "value": "ha"},
                ],
                "category": "Other",
                "subcategory": "x",
                "task": "t",
                "tools": "null",
            },
            None,
        ),
        (
            {
                "id": "t-bad-tools",
                "conversations": [
                    {"from": "system", "value": _NO_TOOLS},
                    {"from": "human", "value": "Unparsable tools column row"},
                    {"from": "gpt", "value": "ok"},
                ],
                "category": "Other",
                "subcategory": "x",
                "task": "t",
                "tools": "[{",
            },
            None,
        ),
    ],
}

#: Lines appended to a JSONL source: a row with a number where text belongs, and bad JSON.
JSONL_TRAP_LINES = (
    '{"query": 12345, "answer": "a", "resource": "x", "lang": "python"}',
    '{"query": "unterminated',
)


def write_parquet(path: Path, records: list[dict[str, Any]]) -> None:
    """Write records as one parquet file (schema inferred by pyarrow)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path)


def write_json_array(path: Path, records: list[dict[str, Any]]) -> None:
    """Write records as ONE JSON array (the MetaMathQA and Hermes form)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records, ensure_ascii=False, indent=1), encoding="utf-8")


def write_jsonl(
    path: Path, records: list[dict[str, Any]], extra_lines: tuple[str, ...] = ()
) -> None:
    """Write records as JSON Lines, then any raw ``extra_lines`` verbatim."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        for line in extra_lines:
            fh.write(line + "\n")


def write_sample_set(directory: Path, n: int = 60, seed: int = 0, traps: bool = True) -> None:
    """Write the bundled sample files (the names ``include.settings.default_sources`` uses)."""
    d = Path(directory)

    def with_traps(kind: str) -> list[dict]:
        base = list(rows(kind, n, seed))
        return base + [r for r, _ in TRAPS.get(kind, [])] if traps else base

    write_parquet(d / "infinity_instruct_0625.parquet", with_traps("infinity_instruct"))
    write_parquet(d / "webinstructsub.parquet", with_traps("webinstructsub"))
    write_jsonl(
        d / "codefeedback.jsonl", with_traps("codefeedback"), JSONL_TRAP_LINES if traps else ()
    )
    write_json_array(d / "MetaMathQA-395K.json", with_traps("metamathqa"))
    # func_calling and func_calling_singleturn share their prompts, as the published configs do.
    hermes_rows = with_traps("hermes_function_calling")
    write_json_array(d / "hermes_func_calling.json", hermes_rows)
    write_json_array(d / "hermes_func_calling_singleturn.json", hermes_rows[: n // 2])
    write_json_array(
        d / "hermes_glaive_function_calling_5k.json",
        list(rows("hermes_function_calling", n, seed + 1, dup_share=0.5)),
    )
    write_parquet(d / "agentinstruct_os.parquet", with_traps("agentinstruct"))


if __name__ == "__main__":
    import sys

    write_sample_set(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("include/sample_data"))
