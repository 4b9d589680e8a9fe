"""Named prompt sets an evaluation may add beside the held-out split (issue 36, item 2).

The deployment lists them (``DeploymentSettings.allowed_prompt_sets``,
``REGEN_ALLOWED_PROMPT_SETS``: name -> file inside a data root); a trigger only picks names,
so nothing from the form reaches a path. Each file is read as its public set is distributed,
one prompt per row, the first user turn taken (a measured request is one turn: ``measure``
sends one chat request per prompt, so MT-Bench's second turns are not sent):

- MT-Bench ``question.jsonl`` (lm-sys FastChat ``llm_judge/data/mt_bench``):
  ``{"question_id", "category", "turns": [...]}`` -> ``turns[0]``, id ``question_id``;
  its Hub copy (``HuggingFaceH4/mt_bench_prompts``) has ``"prompt": [...]`` and ``prompt_id``;
- GSM8K ``test.jsonl`` (openai/grade-school-math): ``{"question", "answer"}`` -> ``question``
  (the answer is never sent), id its line;
- HumanEval ``HumanEval.jsonl.gz`` (openai/human-eval): ``{"task_id", "prompt", ...}`` ->
  ``prompt`` verbatim (the stub and docstring, no instruction around it), id ``task_id``;
- any other row with a ``prompt`` string.

Files end ``.jsonl``, ``.jsonl.gz`` or ``.parquet`` (the Hub's copies of these sets). A set's
prompts become prompt records like the split's, their ``source`` ``set:<name>`` and their
``prompt_set`` the name, so the report can keep them apart from the run's own data.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from include.evaluation.records import SET_SOURCE_PREFIX
from include.settings.deployment import env_name, inside_data_roots

SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")
ACCEPTED = ("one JSON object per row with 'turns' (a list of strings: MT-Bench, the first "
            "turn is sent), 'question' (a string: GSM8K) or 'prompt' (a string: HumanEval, or "
            "a list of strings: MT-Bench's Hub copy)")
#: A set is read whole, in check_settings and in every measure task: bounded so a wrong file
#: (a whole training set named by mistake) is refused instead of read into memory.
MAX_BYTES = 64 * 1024 * 1024
MAX_PROMPTS = 20_000
#: Bad lines named per set; the rest are counted (a wrong file would name every line).
SHOWN_LINES = 5
_ID_KEYS = ("question_id", "task_id", "prompt_id")


class PromptSetError(ValueError):
    """A named prompt set cannot be measured (each problem one line of the message)."""


@dataclass(frozen=True)
class PromptSet:
    """One named set: its file and its prompt records, in file order."""

    name: str
    path: str
    prompts: list[dict[str, Any]]


def set_source(name: str) -> str:
    """The ``source`` a set's prompts (and their report rows) carry."""
    return SET_SOURCE_PREFIX + name


def resolve(names: Sequence[str], allowed: Mapping[str, str], roots: Sequence[str]
            ) -> tuple[dict[str, str], list[str]]:
    """Return each usable set's file by name, and why the others are refused."""
    found: dict[str, str] = {}
    problems: list[str] = []
    for name in dict.fromkeys(names):  # a name given twice is measured once
        path = allowed.get(name)
        if path is None:
            problems.append(f"prompt set {name!r} is not one the deployment lists "
                            f"({env_name('allowed_prompt_sets')}: {sorted(allowed)})")
        elif not inside_data_roots(path, list(roots)):
            problems.append(f"prompt set {name!r}: its file {path} is outside the data roots "
                            f"{list(roots)} ({env_name('data_roots')}): refused")
        elif not os.path.isfile(path):
            problems.append(f"prompt set {name!r}: its file {path} does not exist (or is not "
                            f"a file; {env_name('allowed_prompt_sets')})")
        elif not path.endswith(SUFFIXES):
            problems.append(f"prompt set {name!r}: {path} is not a file this reads "
                            f"(it reads {', '.join(SUFFIXES)})")
        elif os.path.getsize(path) > MAX_BYTES:
            problems.append(f"prompt set {name!r}: {path} is over {MAX_BYTES >> 20} MiB; "
                            "a prompt set is a benchmark's few thousand prompts")
        else:
            found[name] = path
    return found, problems


def _rows(path: str) -> Iterator[tuple[int, Any]]:
    """(line number from 1, the parsed row, or the text of why it does not parse)."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield i, row
        return
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for i, line in enumerate(fh, start=1):
            if not line.strip():
                continue  # human-eval's stream_jsonl skips blank lines too
            try:
                yield i, json.loads(line)
            except json.JSONDecodeError as exc:
                yield i, f"not JSON ({exc.msg} at column {exc.colno})"


def _text(row: dict[str, Any]) -> str | None:
    turns = row.get("turns")
    if "turns" in row:
        return turns[0] if isinstance(turns, list) and turns and isinstance(
            turns[0], str) else None
    if "question" in row:
        return row["question"] if isinstance(row["question"], str) else None
    prompt = row.get("prompt")
    if isinstance(prompt, list):
        return prompt[0] if prompt and isinstance(prompt[0], str) else None
    return prompt if isinstance(prompt, str) else None


def _record(name: str, line: int, row: dict[str, Any], text: str) -> dict[str, Any]:
    native = next((row[k] for k in _ID_KEYS if isinstance(row.get(k), str | int)), None)
    local = str(native) if native is not None else f"line-{line}"
    meta: dict[str, Any] = {"prompt_set": name, "line": line}
    if isinstance(row.get("category"), str):
        meta["category"] = row["category"]
    return {"id": f"{set_source(name)}/{local}", "source": set_source(name),
            "prompt_set": name, "metadata": meta,
            "messages": [{"role": "user", "content": text}]}


def read_prompt_set(name: str, path: str) -> PromptSet:
    """Read one set whole; raise PromptSetError naming each bad line (the first few)."""
    prompts: list[dict[str, Any]] = []
    bad: list[str] = []
    seen: dict[str, int] = {}
    where = f"prompt set {name!r} ({path})"
    try:
        for line, row in _rows(path):
            if isinstance(row, str):
                bad.append(f"line {line}: {row}")
                continue
            text = _text(row) if isinstance(row, dict) else None
            if not text or not text.strip():
                keys = sorted(row)[:8] if isinstance(row, dict) else type(row).__name__
                bad.append(f"line {line}: no prompt text (it has {keys})")
                continue
            record = _record(name, line, row, text)
            if record["id"] in seen:
                bad.append(f"line {line}: id {record['id']!r} again (first at line "
                           f"{seen[record['id']]})")
                continue
            seen[record["id"]] = line
            prompts.append(record)
            if len(prompts) > MAX_PROMPTS:
                raise PromptSetError(f"{where}: more than {MAX_PROMPTS} prompts; a prompt set "
                                     "is a benchmark's few thousand prompts")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise PromptSetError(f"{where} cannot be read: {exc}") from None
    except Exception as exc:  # pyarrow's errors for a file that is no parquet
        if not type(exc).__module__.startswith("pyarrow"):
            raise
        raise PromptSetError(f"{where} cannot be read as parquet: {exc}") from None
    if bad:
        more = f"; and {len(bad) - SHOWN_LINES} more lines" if len(bad) > SHOWN_LINES else ""
        raise PromptSetError(f"{where} is malformed: " + "; ".join(bad[:SHOWN_LINES]) + more
                             + f". Accepted: {ACCEPTED}")
    if not prompts:
        raise PromptSetError(f"{where} holds no prompt. Accepted: {ACCEPTED}")
    return PromptSet(name, path, prompts)


def load_prompt_sets(names: Sequence[str], allowed: Mapping[str, str], roots: Sequence[str]
                     ) -> tuple[list[PromptSet], list[str]]:
    """Every named set read, and every problem of every set at once (empty: all usable)."""
    paths, problems = resolve(names, allowed, roots)
    sets: list[PromptSet] = []
    for name, path in paths.items():
        try:
            sets.append(read_prompt_set(name, path))
        except PromptSetError as exc:
            problems.append(str(exc))
    return sets, problems


def named_sets(names: Sequence[str], allowed: Mapping[str, str],
               roots: Sequence[str]) -> list[PromptSet]:
    """The named sets, or PromptSetError with every problem (a task past the check step)."""
    sets, problems = load_prompt_sets(names, allowed, roots)
    if problems:
        raise PromptSetError("\n".join(problems))
    return sets
