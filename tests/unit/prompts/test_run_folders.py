"""A run's own folders (report, forced regeneration) never collide and never escape."""

from __future__ import annotations

import pytest

from include.layout import run_folder


def test_a_safe_run_id_is_its_own_folder() -> None:
    assert run_folder("manual__2026-12-01T10_00_00") == "manual__2026-12-01T10_00_00"


def test_run_ids_that_read_alike_get_different_folders() -> None:
    ids = ["a:b", "a+b", "a b", "a_b", "manual__2026-12-01T10:00:00+00:00",
           "manual__2026-12-01T10_00_00_00_00"]
    folders = [run_folder(i) for i in ids]
    assert len(set(folders)) == len(ids)


@pytest.mark.parametrize("run_id", [".", "..", "", "/", "../x", "...", "a/../../b"])
def test_no_run_id_maps_to_the_folder_itself_or_out_of_it(run_id: str) -> None:
    folder = run_folder(run_id)
    assert folder not in ("", ".", "..") and "/" not in folder and not folder.startswith(".")
