"""One normalised rule for locations and protected prefixes, on S3 and on disk alike."""

from __future__ import annotations

import posixpath
import random

import pytest

from include.storage import (
    StoreError,
    check_protected_prefixes,
    normalize_location,
    split_s3_uri,
    validate_output_location,
)


@pytest.mark.parametrize(
    ("given", "normalised"),
    [
        ("S3://b/x", "s3://b/x"),  # the scheme in any case is S3
        ("s3://b//a///c", "s3://b/a/c"),
        ("s3://b/./a/./c", "s3://b/a/c"),
        ("s3://b/a/../c", "s3://b/c"),  # '..' resolved on S3 as on disk
        ("s3://b/a/", "s3://b/a"),
        ("s3://b/", "s3://b"),
        ("s3://b", "s3://b"),
        ("/data//x///y", "/data/x/y"),
        ("//data/x", "/data/x"),  # POSIX keeps a leading '//'; we do not
        ("/data/./x/.", "/data/x"),
        ("/data/a/../b", "/data/b"),
        ("/a/../../b", "/b"),
        ("/data/x/", "/data/x"),
        ("/", "/"),
    ],
)
def test_locations_are_normalised(given: str, normalised: str) -> None:
    assert normalize_location(given) == normalised
    assert normalize_location(normalised) == normalised


def test_relative_and_home_local_paths_are_made_absolute(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert normalize_location("runs/./x/") == f"{tmp_path}/runs/x"
    assert normalize_location("~/runs") == f"{tmp_path}/home/runs"
    assert split_s3_uri("S3://b//a/./c/") == ("b", "a/c")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("s3:/b/x", "two slashes"),
        ("S3:b/x", "two slashes"),
        ("file:///data/x", "'file:' is not a supported scheme"),
        ("gs://b/x", "'gs:' is not a supported scheme"),
        ("HTTP://host/x", "'HTTP:' is not a supported scheme"),
        ("s3://", "'' is not a bucket name"),
        ("s3:///x", "'' is not a bucket name"),
        ("s3://-b/x", "'-b' is not a bucket name"),
        ("s3://b/../x", "climbs above the bucket"),
        ("s3://b/a/../../x", "climbs above the bucket"),
        ("s3://b/%2e%2e/completions", "percent-escape '%2e'"),
        ("s3://b/completions%2Frun", "percent-escape '%2F'"),
        ("/data/%2E%2E/completions", "percent-escape '%2E'"),
        ("/data/run\n", "control character"),
        ("s3://b/run\t", "control character"),
        ("", "empty"),
        ("  ", "empty"),
    ],
)
def test_bad_locations_are_refused_naming_them(given: str, message: str) -> None:
    with pytest.raises(StoreError, match="location") as err:
        normalize_location(given)
    assert message in str(err.value) and repr(given) in str(err.value)
    with pytest.raises(StoreError, match="output location"):
        validate_output_location(given, ["completions/"])


# (location, protected prefixes, how it is refused), the same case on S3 and on disk.
_REFUSED = [
    # a relative prefix: whole segments at any depth, on S3 as on disk
    ("s3://b/completions", ["completions/"], "is equal to"),
    ("/data/completions", ["completions/"], "is equal to"),
    ("s3://b/runs/completions/r1", ["completions"], "is inside"),
    ("/data/runs/completions/r1", ["completions"], "is inside"),
    ("s3://completions/r1", ["completions/"], "is inside"),  # the bucket is a segment too
    ("/completions/r1", ["completions/"], "is inside"),
    ("s3://b/x/data/completions/r", ["data/completions"], "is inside"),
    ("/x/data/completions/r", ["data/completions"], "is inside"),
    ("s3://b/x/data", ["data/completions"], "contains"),  # ends partway into the prefix
    ("/x/data", ["data/completions"], "contains"),
    # './', '//' and slashes in a prefix do not matter
    ("s3://b/completions/r", ["./completions/"], "is inside"),
    ("/data/completions/r", ["./completions/"], "is inside"),
    ("s3://b/x/completions", ["completions//"], "is equal to"),
    ("/x/completions", ["/x//completions/."], "is equal to"),
    # scheme case, in the location and in the prefix
    ("S3://b/completions/r", ["completions/"], "is inside"),
    ("s3://b/completions/r", ["S3://b/completions"], "is inside"),
    # '//' runs, './' and '..' in the location
    ("s3://b//completions//r", ["completions/"], "is inside"),
    ("/data//completions//r", ["completions/"], "is inside"),
    ("s3://b/./completions/./r", ["completions/"], "is inside"),
    ("/data/./completions/./r", ["completions/"], "is inside"),
    ("s3://b/runs/../completions/r", ["completions/"], "is inside"),
    ("/data/runs/../completions/r", ["completions/"], "is inside"),
    ("s3://b/runs/x/../../completions", ["s3://b/completions"], "is equal to"),
    ("/data/runs/x/../../completions", ["/data/completions"], "is equal to"),
    # trailing slashes
    ("s3://b/completions/", ["completions"], "is equal to"),
    ("/data/completions/", ["completions"], "is equal to"),
    # a full s3:// prefix: that bucket from its root; equal, inside or containing
    ("s3://b/completions/a/b", ["s3://b/completions"], "is inside"),
    ("s3://b/x", ["s3://b/x/completions/"], "contains"),
    ("s3://b/", ["s3://b/completions"], "contains"),
    ("s3://b/x", ["s3://b"], "is inside"),  # a whole bucket protected
    # a '/' prefix: from the root of the disk and of every bucket
    ("/data/completions/run1/", ["/data/completions"], "is inside"),
    ("/data", ["/data/completions/"], "contains"),
    ("/", ["/data/completions"], "contains"),
    ("s3://b/completions/run", ["/completions/"], "is inside"),
    ("s3://b", ["/completions"], "contains"),
]


@pytest.mark.parametrize(("uri", "protected", "relation"), _REFUSED)
def test_equal_inside_and_containing_are_refused(uri: str, protected: list[str], relation: str):
    with pytest.raises(StoreError) as err:
        validate_output_location(uri, protected)
    message = str(err.value)
    assert f"{relation} protected prefix {protected[0]!r}" in message
    assert repr(uri) in message and f"normalised: {normalize_location(uri)}" in message
    assert "another run_name" in message
    assert "REGEN_OUTPUT_ROOT / REGEN_PROTECTED_PREFIXES" in message


@pytest.mark.parametrize(
    ("uri", "protected"),
    [
        ("s3://b/completions-v2/run", ["completions/"]),
        ("/data/completions-v2", ["completions/"]),
        ("s3://b/xcompletions/run", ["completions/"]),
        ("s3://b/completions", ["s3://other/completions/"]),  # another bucket
        ("/data/runs", ["/data/completions"]),
        ("/data/runs", ["s3://b/data/runs"]),  # an s3:// prefix never protects a local path
        ("s3://b/runs", []),
        ("s3://b/x/data2", ["data/completions"]),
        ("/x/data/other", ["data/completions"]),
        ("/data/..completions/r", ["completions/"]),  # '..completions' is a name, not '..'
        # A relative prefix matches at any depth: a location relates to it only through its
        # own segments, the bucket root as much as any folder (see check_write for keys).
        ("s3://b", ["completions/"]),
        ("/data", ["completions/"]),
    ],
)
def test_neighbours_are_allowed(uri: str, protected: list[str]) -> None:
    validate_output_location(uri, protected)


def test_relative_local_locations_are_checked_where_they_resolve(tmp_path, monkeypatch) -> None:
    (tmp_path / "completions").mkdir()
    monkeypatch.chdir(tmp_path / "completions")
    with pytest.raises(StoreError, match=str(tmp_path / "completions" / "run")):
        validate_output_location("run", ["completions/"])
    with pytest.raises(StoreError, match="is inside protected prefix"):
        validate_output_location("../completions/./run", [str(tmp_path / "completions")])


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ("", "would protect everything"),
        ("/", "would protect everything"),
        ("./", "would protect everything"),
        ("s3://b/../..", "climbs above the bucket"),
        ("*", "not wildcards"),
        ("completions*", "not wildcards"),
        ("*/completions", "not wildcards"),
        ("s3://b/*/completions", "not wildcards"),
        ("complet?ons", "not wildcards"),
        ("../completions", "'..' has no meaning"),
        ("completions/%2e%2e", "percent-escape"),
        ("http://host/completions", "not a supported scheme"),
        ("completions\n", "control character"),
    ],
)
def test_misconfigured_prefixes_are_refused_naming_them(prefix: str, message: str) -> None:
    for check in (
        lambda: check_protected_prefixes(["completions/", prefix]),
        # refused even where the location would be allowed, and where another prefix hits
        lambda: validate_output_location("s3://b/runs/r1", ["completions/", prefix]),
        lambda: validate_output_location("/data/completions/r1", ["completions/", prefix]),
    ):
        with pytest.raises(StoreError, match="protected prefix") as err:
            check()
        assert message in str(err.value) and repr(prefix) in str(err.value)


def test_checked_is_what_is_written_for_random_spellings() -> None:
    """A location and its normalised form are refused alike, and as POSIX reads the path."""
    rng = random.Random()
    names = ["completions", "runs", "x", ".", "..", "", "completions-v2"]
    for _ in range(2000):
        parts = [rng.choice(names) for _ in range(rng.randint(0, 6))]
        trail = rng.choice(["", "/", "//"])
        for root in ("s3://b/", "/data/"):
            uri = root + "/".join(parts) + trail
            # The oracle: POSIX dot and slash rules, with the bucket's root as '/'.
            path = "/".join(parts).lstrip("/") or "."
            if root == "s3://b/" and posixpath.normpath(path).split("/")[0] == "..":
                with pytest.raises(StoreError, match="climbs above the bucket"):
                    normalize_location(uri)
                continue
            resolved = posixpath.normpath(("" if root == "s3://b/" else "/data/") + path)
            expected = "completions" in resolved.split("/")
            for spelling in (uri, normalize_location(uri)):
                try:
                    validate_output_location(spelling, ["completions/"])
                    refused = False
                except StoreError:
                    refused = True
                assert refused == expected, (uri, spelling)
