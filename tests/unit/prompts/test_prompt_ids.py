"""Prompt ids: unique by construction, unchanged where they were unique, alike on every path."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

import include.prompts.sources as per_source
from include.prompts import prepare_prompts, read_shard
from include.prompts.rows import row_id
from include.storage import LocalStore
from synthetic_sources import rows, write_json_array, write_parquet

PREFIX = "src:default:"


def _ids(raw: list[Any]) -> list[str]:
    seen: set[str] = set()
    return [row_id(PREFIX, r, i, seen) for i, r in enumerate(raw)]


def _old_ids(raw: list[Any]) -> list[str]:
    """The scheme before ids were made unique: what existing outputs hold."""
    seen: set[str] = set()
    out = []
    for i, r in enumerate(raw):
        rid = f"{PREFIX}{r if r not in (None, '') else i}"
        if rid in seen:
            rid = f"{PREFIX}{r}#{i}"
        seen.add(rid)
        out.append(rid)
    return out


@pytest.mark.parametrize(
    "raw",
    [
        ["a#2", "a", "a"],  # the repeat's disambiguation is a real id
        ["a", "a", "a#1"],  # a real id equal to an earlier disambiguation
        ["a#2#2", "a#2", "a", "a"],  # and again one level down
        ["1", None, ""],  # a missing id falls back to the index, which is a real id
        [None, "0", "0"],
        [1, "1", 1.0, "1.0"],  # values that print alike
        ["x"] * 6,
        ["a#3", "a#3#3", "a", "a", "a#3#3#3"],
    ],
)
def test_adversarial_raw_ids_give_unique_ids(raw: list[Any]) -> None:
    ids = _ids(raw)
    assert len(set(ids)) == len(ids), ids
    assert all(i.startswith(PREFIX) for i in ids)


def test_the_first_holder_of_an_id_keeps_it_and_a_repeat_gets_its_row_index() -> None:
    assert _ids(["a#2", "a", "a"]) == [f"{PREFIX}a#2", f"{PREFIX}a", f"{PREFIX}a#2#2"]
    assert _ids(["a", "a", "b", None]) == [f"{PREFIX}a", f"{PREFIX}a#1", f"{PREFIX}b", f"{PREFIX}3"]
    assert _ids(["1", None, None]) == [f"{PREFIX}1", f"{PREFIX}None#1", f"{PREFIX}2"]


def test_random_raw_ids_are_unique_and_keep_every_id_the_old_scheme_gave_once() -> None:
    rng = random.Random()
    alphabet = ["a", "b", "1", "2", "a#1", "a#2", "a#2#2", "b#3", "1#1", "", None, 0, 1, 2]
    for _ in range(3000):
        raw = [rng.choice(alphabet) for _ in range(rng.randint(0, 9))]
        ids = _ids(raw)
        assert len(set(ids)) == len(ids), raw
        old = _old_ids(raw)
        if len(set(old)) == len(old):  # where the old ids were unique, nothing changes
            assert ids == old, raw
        given = [str(r) for r in raw if r not in (None, "")]
        if len(given) == len(raw) == len(set(given)):  # unique raw ids are the ids themselves
            assert ids == [PREFIX + r for r in given]


_ADVERSARIAL = ["a#2", "a", "a", "b", "b#4", "b", "c#7#7", "c", "c", "c#7"]


def _sources(tmp_path: Path) -> list[dict[str, Any]]:
    wis = list(rows("webinstructsub", len(_ADVERSARIAL), dup_share=0))
    for row, rid in zip(wis, _ADVERSARIAL, strict=True):
        row["index"] = rid
    write_parquet(tmp_path / "wis.parquet", wis)
    write_json_array(tmp_path / "wis.json", wis)
    ii = list(rows("infinity_instruct", len(_ADVERSARIAL), dup_share=0))
    for row, rid in zip(ii, _ADVERSARIAL, strict=True):
        row["id"] = rid
    write_parquet(tmp_path / "ii.parquet", ii)
    return [
        {"name": "wis_parquet", "kind": "webinstructsub", "path": str(tmp_path / "wis.parquet")},
        {"name": "wis_json", "kind": "webinstructsub", "path": str(tmp_path / "wis.json")},
        {"name": "ii", "kind": "infinity_instruct", "path": str(tmp_path / "ii.parquet")},
    ]


def _prompt_ids(settings) -> dict[str, list[str]]:
    store = LocalStore(settings.run_uri)
    manifest = prepare_prompts(settings, store)
    out: dict[str, list[str]] = {}
    for i in range(len(manifest["shards"])):
        for record in read_shard(store, i):
            out.setdefault(record["source"], []).append(record["id"])
    return {name: sorted(ids) for name, ids in out.items()}


def test_ids_are_unique_and_the_same_on_the_column_and_row_paths(
    make_settings, tmp_path, monkeypatch
) -> None:
    sources = _sources(tmp_path)
    taken: set[str] = set()
    for path in ("read_flat_columns", "read_columns"):
        original = getattr(per_source, path)

        def spy(state, *args, _original=original, _path=path):
            taken.add(f"{state.source.name}:{_path}")
            return _original(state, *args)

        monkeypatch.setattr(per_source, path, spy)
    # One run per source: they share prompts, and dedupe across sources keeps only the first.
    fast = {}
    for s in sources:
        fast.update(_prompt_ids(make_settings([s], run_name=f"fast-{s['name']}")))
    assert {"wis_parquet:read_flat_columns", "ii:read_columns"} <= taken
    monkeypatch.setattr(per_source, "column_wise", lambda state, batch: False)
    slow = {}
    for s in sources:
        slow.update(_prompt_ids(make_settings([s], run_name=f"slow-{s['name']}")))
    assert fast == slow
    assert set(fast) == {s["name"] for s in sources}
    for name, ids in fast.items():
        expected = [i.replace(PREFIX, f"{name}:default:") for i in _ids(_ADVERSARIAL)]
        assert ids == sorted(expected) and len(set(ids)) == len(_ADVERSARIAL), name
