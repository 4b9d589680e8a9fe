"""JSON sources read in bounded memory: arrays cut anywhere by the window, odd text and items,
broken files, and the same values the ``datasets`` loader gave."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import include.prompts.json_stream as json_stream
from include.prompts.json_stream import MALFORMED_KEY, JsonReadError, json_parts
from include.prompts.readers import SourceReadError, iter_batches
from include.settings import SourceSettings
from synthetic_sources import rows, write_json_array, write_jsonl

_ODD = [
    {"q": "brackets ] [ and braces } { inside", "n": 1},
    {"q": 'escaped " quote", then } ], {"fake": [1, and a comma,', "n": 22},
    {"q": "a backslash at the end \\", "n": 333},
    {"q": "\\\"\\\\\"", "n": 4},
    {"q": "unicode é 数学 🙂 \u2028 line separator, tab\t, newline\n", "n": -4.5},
    {"q": "", "n": 0},
    {"q": "x" * 300, "n": 12345678901},
    {"q": "nested", "n": 5, "more": {"list": [[], [{}], [1, 2.5]], "t": True, "f": None}},
]

_LAYOUTS = {
    "compact": lambda items: json.dumps(items, ensure_ascii=False, separators=(",", ":")),
    "spaced": lambda items: json.dumps(items, ensure_ascii=False),
    "indented": lambda items: json.dumps(items, ensure_ascii=False, indent=4),
    "ascii": lambda items: json.dumps(items, indent=1),
    "odd_white_space": lambda items: " \r\n\t[ \n"
    + "\r\n ,\t".join(json.dumps(i, ensure_ascii=False) for i in items)
    + "\n\t ]\r\n\n",
}


def _rows(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for part in json_parts(str(path), "source t"):
        out += part if isinstance(part, list) else part.to_pylist()
    return out


def _window(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    monkeypatch.setattr(json_stream, "PART_SIZE", size)


def _same(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    # Arrow gives every row every field of the part (None where a row has none).
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert {k: v for k, v in g.items() if k in e or v is not None} == e


@pytest.mark.parametrize("window", [1, 2, 3, 5, 8, 13, 64, 1 << 20])
@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
def test_an_array_cut_anywhere_by_the_window_gives_every_item_exactly(
    tmp_path, monkeypatch, window, layout
) -> None:
    path = tmp_path / "a.json"
    path.write_text(_LAYOUTS[layout](_ODD), encoding="utf-8")
    _window(monkeypatch, window)
    with open(path, encoding="utf-8", newline="") as fh:
        items = list(json_stream._JsonArray(fh, str(path)))
    assert [item for item, _ in items] == _ODD
    assert all(json.loads(text) == item for item, text in items)
    _same(_rows(path), _ODD)


@pytest.mark.parametrize("window", [1, 4, 1 << 20])
@pytest.mark.parametrize("text", ["[]", " [ ]\n", "\n\t[\r\n]\n\n", "\ufeff[]", "\ufeff [{}]"])
def test_empty_arrays_and_a_byte_order_mark(tmp_path, monkeypatch, window, text) -> None:
    path = tmp_path / "a.json"
    path.write_text(text, encoding="utf-8")
    _window(monkeypatch, window)
    assert _rows(path) == ([{}] if "{" in text else [])


def test_items_that_are_no_object_are_malformed_rows_and_keep_every_index(tmp_path) -> None:
    path = tmp_path / "mm.json"
    path.write_text('[{"query": "first one?"}, 2, "x", null, [1], {"query": "last one?"}]')
    source = SourceSettings(name="mm", path=str(path))
    batches = list(iter_batches(source))
    got = [(b.start + i, row) for b in batches for i, row in enumerate(b.rows)]
    assert [index for index, _ in got] == list(range(6))
    assert got[0][1] == {"query": "first one?"} and got[5][1] == {"query": "last one?"}
    assert [row.get(MALFORMED_KEY) for _, row in got[1:5]] == [
        "array item 1 is int, not an object",
        "array item 2 is str, not an object",
        "array item 3 is NoneType, not an object",
        "array item 4 is list, not an object",
    ]
    assert batches[0].table is not None  # the objects around them still go column-wise


@pytest.mark.parametrize("window", [1, 3, 1 << 20])
def test_a_truncated_array_fails_naming_the_file_wherever_it_is_cut(
    tmp_path, monkeypatch, window
) -> None:
    doc = json.dumps(_ODD[:4], ensure_ascii=False, indent=1)
    _window(monkeypatch, window)
    path = tmp_path / "cut.json"
    for cut in range(1, len(doc)):
        path.write_text(doc[:cut], encoding="utf-8")
        with pytest.raises(JsonReadError, match="truncated") as err:
            _rows(path)
        assert str(path) in str(err.value), cut


@pytest.mark.parametrize("window", [2, 1 << 20])
@pytest.mark.parametrize(
    "doc",
    [
        '[{"a": 1}, {"a" 2}, {"a": 3}]',
        '[{"a": 1}, {"a": 2,, "b": 1}, {"a": 3}]',
        '[{"a": 1}, {"a": "raw\nnewline"}]',
        '[{"a": 1} {"a": 2}]',
        '[{"a": 1},]',
        '[{"a": 1}] trailing',
        '[{"a": 1}]]',
    ],
)
def test_invalid_json_in_an_array_fails_with_its_place(tmp_path, monkeypatch, window, doc):
    path = tmp_path / "bad.json"
    path.write_text(doc)
    _window(monkeypatch, window)
    with pytest.raises(JsonReadError, match=r"not valid JSON \(.* at character \d+\)") as err:
        _rows(path)
    try:
        json.loads(doc)
    except json.JSONDecodeError as exc:  # the standard library's place, the same but for
        reported = int(str(err.value).split("at character ")[1].split(")")[0])
        assert abs(reported - exc.pos) <= 1, (reported, exc.pos)  # a skipped ',' or ']'


def test_a_source_names_itself_in_the_error(tmp_path) -> None:
    path = tmp_path / "mm.json"
    path.write_text('[{"query": "a"}, {"query": ')
    with pytest.raises(SourceReadError, match=r"source 'mm': .*mm\.json.*truncated"):
        list(iter_batches(SourceSettings(name="mm", path=str(path))))


def test_json_lines_across_parts_with_one_broken_line_and_one_odd_type(
    tmp_path, monkeypatch
) -> None:
    records = [{"query": f"question {i} " + "w" * (i % 7), "lang": "py"} for i in range(40)]
    path = tmp_path / "cf.jsonl"
    lines = [json.dumps(r) for r in records]
    lines[16] = '{"query": "unterminated'
    lines[30] = '{"query": 12345, "lang": "py"}'
    path.write_text("\n".join(lines[:20]) + "\n\n" + "\n".join(lines[20:]) + "\n")
    _window(monkeypatch, 64)
    parts = list(json_parts(str(path), "source cf"))
    got = [r for p in parts for r in (p if isinstance(p, list) else p.to_pylist())]
    assert len(got) == 40
    assert got[16] == {MALFORMED_KEY: "cf.jsonl line 17: invalid JSON (Unterminated string "
                                      "starting at)"}
    assert got[30] == {"query": 12345, "lang": "py"}
    assert [g for i, g in enumerate(got) if i not in (16, 30)] == [
        r for i, r in enumerate(records) if i not in (16, 30)
    ]
    assert sum(not isinstance(p, list) for p in parts) > 2  # only some parts went row by row


@pytest.mark.parametrize("form", ["lines", "array"])
def test_invalid_utf8_reaches_the_rows_as_surrogates_not_as_an_error(tmp_path, form) -> None:
    good = json.dumps({"query": "fine"}).encode()
    bad = b'{"query": "bad \xff byte"}'
    path = tmp_path / "x.json"
    path.write_bytes(b"\n".join([good, bad, good]) if form == "lines"
                     else b"[" + b",".join([good, bad, good]) + b"]")
    assert _rows(path) == [{"query": "fine"}, {"query": "bad \udcff byte"}, {"query": "fine"}]


@pytest.mark.parametrize(
    ("kind", "writer"),
    [
        ("metamathqa", write_json_array),
        ("hermes_function_calling", write_json_array),
        ("codefeedback", write_jsonl),
        ("metamathqa", write_jsonl),
    ],
)
def test_rows_are_what_the_datasets_json_loader_gives(tmp_path, monkeypatch, kind, writer):
    import datasets

    path = tmp_path / f"{kind}.json"
    writer(path, list(rows(kind, 300)))
    _window(monkeypatch, 20_000)  # many parts
    ours = [r for b in iter_batches(SourceSettings(name=kind, path=str(path)), batch_size=7)
            for r in b.rows]
    loaded = datasets.load_dataset(
        "json", data_files=[str(path)], split="train", cache_dir=str(tmp_path / "cache")
    )
    assert ours == list(loaded)


def test_items_before_the_first_object_are_counted_once_the_layout_is_known(
    make_settings, tmp_path
) -> None:
    from include.prompts import prepare_prompts
    from include.storage import LocalStore

    path = tmp_path / "mm.json"
    row = '{"query": "What is %s plus %s?", "response": "r", "type": "GSM_SV"}'
    path.write_text(f'[1, "x", {row % ("one", "one")}, 2, {row % ("two", "two")}]')
    settings = make_settings([{"name": "mm", "path": str(path)}])
    funnel = prepare_prompts(settings, LocalStore(settings.run_uri))["sources"]["mm"]
    assert funnel["kind"] == "metamathqa"
    assert (funnel["read"], funnel["kept"], funnel["dropped"]) == (5, 2, {"malformed": 3})
    first = funnel["drop_samples"]["malformed"][0]
    assert first == "mm:default:0 (array item 0 is int, not an object)"
