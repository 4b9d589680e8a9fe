"""The prepare stage's fast paths give exactly what the plain forms they replace give."""

from __future__ import annotations

import datetime
import decimal
import json
import re
import sys
import unicodedata
from pathlib import Path

import pytest

from include.prompts.encoding import encode_record
from include.prompts.readers import _probe_parquet
from include.prompts.schemas import KINDS, MalformedRow, RawTurn
from include.prompts.turns import (
    _INVISIBLE,
    DropRow,
    _fold,
    _many_turns,
    _one_turn,
    to_messages,
)
from synthetic_sources import GENERATORS, TRAPS, rows, write_parquet

_SPACE = re.compile(r"\s+")
_WHITESPACE = "".join(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace())
_TEXTS = [
    "",
    " ",
    "plain ascii prompt",
    "  lead and trail  \n",
    "tabs\tand\nnew\r\nlines\x0b\x0cand\x1c\x1d\x1e\x1fseparators",
    "zero\u200bwidth\u200c\u200d\u2060\ufeffchars",
    "\u200b",
    " \u200b ",
    "Ｃａｆé naïve 数学 🙂 x² ﬁ ① ㎏",
    "non\u00a0breaking\u3000ideographic\u2028line\u2029para\x85next",
    "e\u0301 composed",
    "lone \ud800 surrogate",
    "all whitespace: " + _WHITESPACE,
    _WHITESPACE,
    "mixed" + _WHITESPACE + "runs" + _WHITESPACE,
]


def _reference_fold(text: str) -> str:
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text).translate(_INVISIBLE)).strip()


@pytest.mark.parametrize("text", _TEXTS)
def test_fold_equals_nfkc_translate_and_regex_form(text: str) -> None:
    assert _fold(text) == _reference_fold(text)


def test_fold_agrees_on_every_code_point_between_words() -> None:
    for c in range(sys.maxunicode + 1):
        text = f" a{chr(c)}b {chr(c)}"
        assert _fold(text) == _reference_fold(text), hex(c)


@pytest.mark.parametrize(
    "record",
    [
        {
            "id": "a:b:1",
            "source": "s",
            "messages": [{"role": "user", "content": "hi"}],
            "metadata": {"source_kind": "k", "index": 3},
        },
        {"z": 1.5, "a": [-0.0, 1e-300, 0.1, 10**30], "m": {"b": None, "a": True}},
        {"text": 'quote " back \\ ctrl \x00\x1f\x7f tab\t nl\n unicode é 数学 🙂 \u2028'},
        {"label": {"ability_en": ["math"], "ability_zh": [], "nested": {"y": [1, {"x": 2}]}}},
        {"when": datetime.date(2024, 1, 2), "amount": decimal.Decimal("1.10"), "raw": b"x"},
        {"tuple": (1, "two"), "empty": {}, "int_keyed": {2: "b", 1: "a"}},
    ],
)
def test_encode_record_equals_json_dumps(record: dict) -> None:
    from include.jsonl import escape_breaks

    # json.dumps's bytes, with the line breaks it leaves raw escaped (include/jsonl.py).
    expected = escape_breaks(json.dumps(
        record, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str,
        allow_nan=False,
    ))
    assert encode_record(record) == (expected + "\n").encode("utf-8")


_ROLES = ["user", "human", " Human ", "gpt", "assistant", "system", "tool", "narrator"]
_CONTENTS = ["hello", "", "  \n", "x\ud800y", "数学"]
_POLICIES = ["first_user", "until_first_trained_assistant", "until_last_user", "bogus"]


def _outcome(fn, turns, policy):
    try:
        return "ok", fn(turns, policy)
    except DropRow as exc:
        return "drop", exc.reason, exc.detail
    except ValueError as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("policy", _POLICIES)
@pytest.mark.parametrize("role", _ROLES)
@pytest.mark.parametrize("loss", [None, True, False])
def test_one_turn_path_equals_the_general_path(policy: str, role: str, loss) -> None:
    for content in _CONTENTS:
        turns = [RawTurn(role, content, loss)]
        assert _outcome(lambda t, p: _one_turn(t[0], p), turns, policy) == _outcome(
            _many_turns, turns, policy
        )
        assert _outcome(to_messages, turns, policy) == _outcome(_many_turns, turns, policy)


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_kind_columns_hold_everything_a_kind_reads(kind: str) -> None:
    # Readers load only Kind.columns; a row cut down to them must give the same prompt,
    # metadata, ids and filter values as the whole row.
    k = KINDS[kind]
    samples = list(rows(kind, 30, dup_share=0)) + [r for r, _ in TRAPS.get(kind, [])]

    def seen(row: dict) -> tuple:
        try:
            turns = k.turns(row)
        except MalformedRow as exc:
            turns = str(exc)
        meta = k.extra_metadata(row) if k.extra_metadata else None
        named = [row.get(c) for c in (k.id_column, k.language_column, k.source_column) if c]
        return turns, meta, named, [row.get(c) for c in k.metadata_columns]

    for row in samples:
        cut = {c: v for c, v in row.items() if c in k.columns}
        assert seen(cut) == seen(row)


def test_parquet_probe_gives_the_columns_and_first_row_datasets_loads(tmp_path: Path) -> None:
    import datasets

    first = tmp_path / "a.parquet"
    second = tmp_path / "b.parquet"
    write_parquet(first, list(rows("infinity_instruct", 5)))
    write_parquet(second, list(rows("infinity_instruct", 5, seed=1)))
    files = [str(first), str(second)]
    loaded = datasets.load_dataset(
        "parquet", data_files=files, split="train", cache_dir=str(tmp_path / "cache")
    )
    assert _probe_parquet(files) == (loaded.column_names, loaded[0])
