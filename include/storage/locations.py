"""Locations (``s3://bucket/prefix`` or a local path) and the protected prefixes none may touch.

One rule for S3 and local paths, with no I/O. A location is normalised before it is checked,
and the normalised form is what ``open_store`` opens, so what is checked is what is written:

- the scheme is case-insensitive (``S3://b/x`` is S3); any other ``scheme:`` is refused, so a
  typo never becomes a local directory named ``S3:``;
- ``//`` runs, ``.`` segments and a trailing slash are dropped and ``..`` is resolved, on S3
  as on disk (on S3 it may not climb above the bucket); a local path is made absolute, with
  ``~`` expanded (symbolic links are followed by ``open_store``, which checks the real path);
- percent-escapes (``%2F``, ``%2e%2e``) are refused, never decoded: S3 and the file system take
  them literally while other tools decode them, so neither reading is safe to compare; control
  characters are refused too.

A protected prefix is ``s3://bucket/path`` (that bucket, from its root), ``/path`` (from the
root of the file system and of every bucket: refusing too much on S3 is safer than protecting
nothing there) or relative, ``path``: whole path segments at any depth, in a local path and in
the ``bucket/key`` of an S3 location alike. ``./`` and slashes do not matter
(``./completions/`` is ``completions``); ``*`` and ``?`` are refused as a deployment
misconfiguration (prefixes are literal, and a relative one already matches anywhere), as are
``..`` in a relative prefix and an empty prefix (it would protect everything).
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from include.storage.errors import StoreError

#: The original training data's prefix; see ``protected_prefixes`` in the deployment settings.
DEFAULT_PROTECTED_PREFIXES: tuple[str, ...] = ("completions/",)

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_BUCKET = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._\-]*[A-Za-z0-9])?")
_ACCEPTED = "accepted: s3://bucket/prefix or a local path"
_DEPLOYMENT_FIX = (
    "Choose another run_name, or ask whoever deploys to change REGEN_OUTPUT_ROOT / "
    "REGEN_PROTECTED_PREFIXES if this location really is theirs to write"
)
_RELATION = {"equal": "is equal to", "inside": "is inside", "contains": "contains"}


@dataclass(frozen=True)
class Location:
    """A normalised location: ``scheme`` is ``"s3"`` or ``"file"`` (then ``bucket`` is "")."""

    scheme: str
    bucket: str
    segments: tuple[str, ...]

    def __str__(self) -> str:
        if self.scheme == "s3":
            return "/".join((f"s3://{self.bucket}", *self.segments))
        return "/" + "/".join(self.segments)

    @property
    def path(self) -> tuple[str, ...]:
        """Return the segments a relative prefix is looked for in (``bucket/key`` on S3)."""
        return (self.bucket, *self.segments) if self.scheme == "s3" else self.segments


def _check_text(text: str, what: str) -> None:
    if not isinstance(text, str) or not text.strip():
        raise StoreError(f"{what} {text!r} is empty; {_ACCEPTED}")
    if m := _CONTROL.search(text):
        raise StoreError(f"{what} {text!r} contains the control character {m.group()!r}; "
                         "remove it")
    if m := _ESCAPE.search(text):
        raise StoreError(
            f"{what} {text!r} contains the percent-escape {m.group()!r}; locations are taken "
            "literally and never URL-decoded: write the character itself")


def parse_location(uri: str, what: str = "location") -> Location:
    """Return ``uri`` normalised (see the module docstring); raise StoreError naming it."""
    _check_text(uri, what)
    m = _SCHEME.match(uri)
    if m is None:
        path = os.path.abspath(os.path.expanduser(uri))  # normalised, but may keep a leading //
        return Location("file", "", tuple(p for p in path.split("/") if p))
    scheme, rest = m.group()[:-1], uri[m.end():]
    if scheme.lower() == "s3" and not rest.startswith("//"):
        raise StoreError(f"{what} {uri!r}: expected s3://bucket/prefix (two slashes)")
    if scheme.lower() != "s3":
        raise StoreError(f"{what} {uri!r}: {scheme + ':'!r} is not a supported scheme; "
                         f"{_ACCEPTED} (the scheme in any case, e.g. S3://)")
    bucket, _, key = rest[2:].partition("/")
    if not _BUCKET.fullmatch(bucket):
        raise StoreError(f"{what} {uri!r}: {bucket!r} is not a bucket name; expected "
                         "s3://bucket/prefix")
    key = posixpath.normpath(key.lstrip("/") or ".")
    if key == ".." or key.startswith("../"):
        raise StoreError(f"{what} {uri!r}: '..' climbs above the bucket {bucket!r}; remove it")
    return Location("s3", bucket, tuple(p for p in key.split("/") if p not in ("", ".")))


def normalize_location(uri: str) -> str:
    """Return the one spelling of ``uri`` that is checked and written (``s3://b/k`` or ``/p``)."""
    return str(parse_location(uri))


@dataclass(frozen=True)
class _Prefix:
    anchor: str  # "bucket" (s3://bucket/...), "root" (/...) or "anywhere" (relative)
    bucket: str
    segments: tuple[str, ...]


def _parse_prefix(prefix: str) -> _Prefix:
    what = "protected prefix"
    fix = "ask whoever deploys to fix REGEN_PROTECTED_PREFIXES"
    everything = f"{what} {prefix!r} is empty or the root: it would protect everything; {fix}"
    if isinstance(prefix, str) and not prefix.strip():
        raise StoreError(everything)
    _check_text(prefix, what)
    if "*" in prefix or "?" in prefix:
        raise StoreError(
            f"{what} {prefix!r}: '*' and '?' are not wildcards here; a protected prefix is "
            "literal path segments, and a relative one (e.g. 'completions/') already matches "
            f"at any depth; {fix}")
    if _SCHEME.match(prefix):
        loc = parse_location(prefix, what)
        return _Prefix("bucket", loc.bucket, loc.segments)
    if prefix.startswith(("/", "~")):
        loc = parse_location(prefix, what)
        if not loc.segments:
            raise StoreError(everything)
        return _Prefix("root", "", loc.segments)
    parts = tuple(p for p in prefix.split("/") if p not in ("", "."))
    if ".." in parts:
        raise StoreError(f"{what} {prefix!r}: '..' has no meaning in a relative prefix (it "
                         f"matches at any depth); {fix}")
    if not parts:
        raise StoreError(everything)
    return _Prefix("anywhere", "", parts)


def check_protected_prefixes(protected_prefixes: Sequence[str]) -> None:
    """Raise StoreError naming the first protected prefix that is not a valid one."""
    for prefix in protected_prefixes:
        _parse_prefix(prefix)


def _relation(loc: Location, p: _Prefix, containing: bool) -> str | None:
    """Return how ``loc`` relates to an instance of ``p``: equal, inside, contains or None."""
    want, n = p.segments, len(p.segments)
    if p.anchor == "anywhere":
        path = loc.path
        for i in range(len(path) - n + 1):
            if path[i : i + n] == want:
                return "equal" if i + n == len(path) else "inside"
        # A location ending partway into the prefix (x/data for data/completions) holds one.
        if containing and any(path[-k:] == want[:k] for k in range(1, min(n, len(path) + 1))):
            return "contains"
        return None
    if p.anchor == "bucket" and (loc.scheme != "s3" or loc.bucket != p.bucket):
        return None
    segments = loc.segments
    common = min(len(segments), n)
    if segments[:common] != want[:common]:
        return None
    if len(segments) == n:
        return "equal"
    if len(segments) > n:
        return "inside"
    return "contains" if containing else None


def _hits(loc: Location, protected_prefixes: Sequence[str], containing: bool) -> list[str]:
    check_protected_prefixes(protected_prefixes)  # every one, also when another one hits
    out = []
    for prefix in protected_prefixes:
        relation = _relation(loc, _parse_prefix(prefix), containing)
        if relation:
            out.append(f"{_RELATION[relation]} protected prefix {prefix!r}")
    return out


def validate_output_location(
    uri: str, protected_prefixes: Sequence[str] = DEFAULT_PROTECTED_PREFIXES
) -> None:
    """Raise StoreError if ``uri`` is equal to, inside, or contains a protected prefix.

    Pure (no I/O): call it before any work. The message names the location as given and
    normalised, each protected prefix it hits, and what to do.
    """
    loc = parse_location(uri, "output location")
    hits = _hits(loc, protected_prefixes, containing=True)
    if hits:
        raise StoreError(
            f"output location {uri!r} (normalised: {loc}) {' and '.join(hits)} (protected "
            f"prefixes: {list(protected_prefixes)}); nothing was written. {_DEPLOYMENT_FIX}.")


def check_write(uri: str, protected_prefixes: Sequence[str]) -> None:
    """Raise StoreError if the object at ``uri`` would lie inside a protected prefix.

    A store opened for writing checks every key: a relative prefix may match a key's folder
    below the output location (``prompts/`` protected, say), which no location check sees.
    """
    if not protected_prefixes:
        return
    loc = parse_location(uri)
    hits = _hits(loc, protected_prefixes, containing=False)
    if hits:
        raise StoreError(f"refusing to write {loc}: it {' and '.join(hits)}; nothing was "
                         f"written. {_DEPLOYMENT_FIX}.")
