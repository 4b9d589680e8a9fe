"""Create-only object storage: a key, once written, is never overwritten.

Every stage writes through ``Store`` (``base.py``). Writing a key that already holds identical
bytes counts as done (a retried task succeeds); writing different bytes raises
``ObjectExistsError`` and leaves the existing object untouched. The local implementation lives
here; the S3 one (``s3.py``) uses conditional puts (``If-None-Match: *``) behind the same
interface.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TypeVar

from include.storage.base import Store, copy_hashed, split_lines
from include.storage.errors import ObjectExistsError, StoreError
from include.storage.locations import (
    DEFAULT_PROTECTED_PREFIXES,
    Location,
    check_write,
    normalize_location,
    parse_location,
    validate_output_location,
)

if TYPE_CHECKING:
    from include.storage.s3 import S3Store

log = logging.getLogger(__name__)
T = TypeVar("T")
#: How much of a local file ``iter_lines`` reads at a time.
_CHUNK = 8 * 1024 * 1024


class LocalStore:
    """A ``Store`` over a local directory, for local runs and tests."""

    #: Protected prefixes every key written is checked against (set by ``open_store``).
    protected: tuple[str, ...] = ()

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = str(Path(root))
        self._root = Path(root)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in Path(key).parts:
            raise StoreError(f"refusing key {key!r}: keys are relative and never leave the root")
        return self._root / key

    def uri(self, key: str) -> str:
        return str(self._path(key))

    def write_new(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        check_write(str(path), self.protected)
        created, _ = self._create(path, lambda fh: fh.write(data))
        if created:
            return True
        if path.read_bytes() == data:
            return False
        raise ObjectExistsError(
            f"{path} already exists with different content; nothing was overwritten. "
            "Write to a new run_name (or output location) instead."
        )

    def write_new_concat(self, key: str, sources: Sequence[str]) -> tuple[int, str]:
        path = self._path(key)
        check_write(str(path), self.protected)
        created, (size, sha) = self._create(
            path, lambda fh: copy_hashed((self._open_source(s, key) for s in sources), fh.write))
        if created:
            return size, sha
        with open(path, "rb") as existing:
            held = copy_hashed([existing], len)
        if held == (size, sha):
            return size, sha
        raise ObjectExistsError(
            f"{path} already exists with different content ({held[0]} bytes, sha256 "
            f"{held[1]}; the concatenation is {size} bytes, sha256 {sha}); nothing was "
            "overwritten. Write to a new run_name (or output location) instead."
        )

    @staticmethod
    def _create(path: Path, fill: Callable[[BinaryIO], T]) -> tuple[bool, T]:
        """Fill a temporary file beside ``path``, then give it the name ``path`` if free.

        Return whether it was created, and what ``fill`` returned.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                filled = fill(fh)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                # link() fails if the target exists: an atomic create-if-absent on POSIX.
                os.link(tmp, path)
                return True, filled
            except FileExistsError:
                return False, filled
        finally:
            os.unlink(tmp)

    def _open_source(self, source: str, key: str) -> BinaryIO:
        try:
            return open(self._path(source), "rb")
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.uri(source)}: no such file (a source of "
                                    f"{self.uri(key)})") from None

    def read(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def iter_lines(self, key: str) -> Iterator[bytes]:
        path = self._path(key)
        with open(path, "rb") as fh:
            yield from split_lines(iter(lambda: fh.read(_CHUNK), b""), str(path))

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self._root
        if base.is_file():
            return [prefix]
        if not base.exists():
            return []
        return sorted(
            str(p.relative_to(self._root))
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".tmp-")
        )

    def list_children(self, prefix: str) -> tuple[list[str], list[str]]:
        folder = prefix.strip("/")
        base = self._path(folder) if folder else self._root
        lead = f"{folder}/" if folder else ""
        keys: list[str] = []
        subs: list[str] = []
        try:
            entries = os.scandir(base)
        except (FileNotFoundError, NotADirectoryError):
            return [], []
        with entries:
            for entry in entries:
                if entry.is_dir():
                    subs.append(f"{lead}{entry.name}/")
                elif entry.is_file() and not entry.name.startswith(".tmp-"):
                    keys.append(f"{lead}{entry.name}")
        return sorted(keys), sorted(subs)


def open_store(
    uri: str,
    *,
    s3_conn_id: str = "aws_default",
    protected_prefixes: Sequence[str] = DEFAULT_PROTECTED_PREFIXES,
    read_only: bool = False,
) -> Store:
    """Return the store at ``uri`` (``s3://bucket/prefix`` or a local directory), normalised.

    The store's root is ``normalize_location(uri)``: the location that was checked. For
    writing (the default) the location is first checked against ``protected_prefixes`` (see
    ``validate_output_location``; a local one also where its symbolic links lead), every key
    written is checked again, and for S3 the bucket and credentials are probed, so a
    misconfiguration fails before any work. ``read_only=True`` skips the protection checks
    (reading protected data, e.g. for dedupe, is fine) and returns a store whose
    ``write_new`` raises StoreError.
    """
    location = normalize_location(uri)
    if not read_only:
        validate_output_location(uri, protected_prefixes)
        real = location if location.startswith("s3://") else os.path.realpath(location)
        if real != location:
            try:
                validate_output_location(real, protected_prefixes)
            except StoreError as exc:
                raise StoreError(f"output location {uri!r} leads through a symbolic link to "
                                 f"{real}: {exc}") from None
        log.info(
            "output location %s (protected prefixes: %s)",
            location,
            ", ".join(protected_prefixes) or "none",
        )
    store: LocalStore | S3Store
    if location.startswith("s3://"):
        from include.storage.s3 import S3Store

        store = S3Store(location, conn_id=s3_conn_id)
        store.check_access()
    else:
        store = LocalStore(location)
    if read_only:
        return ReadOnlyStore(store)
    store.protected = tuple(protected_prefixes)
    return store


def open_readable(location: str, *, s3_conn_id: str = "aws_default") -> tuple[Store, str]:
    """Return a read-only store holding ``location`` and the name ``location`` has in it.

    Not checked against protected prefixes: reading earlier completions (to deduplicate
    against) is legitimate.
    """
    loc = parse_location(location)
    if not loc.segments:
        return open_store(str(loc), read_only=True, s3_conn_id=s3_conn_id), ""
    parent = Location(loc.scheme, loc.bucket, loc.segments[:-1])
    return open_store(str(parent), read_only=True, s3_conn_id=s3_conn_id), loc.segments[-1]


def check_readable(
    location: str, s3_conn_id: str = "aws_default", suffixes: tuple[str, ...] = (".jsonl", ".json")
) -> None:
    """Raise StoreError unless ``location`` holds a readable file ending in ``suffixes``.

    Opens the location read-only (on S3: bucket and credentials), lists until the first such
    file and checks that one can be read, without reading any file whole.
    """
    store, name = open_readable(location, s3_conn_id=s3_conn_id)
    inner = store.inner if isinstance(store, ReadOnlyStore) else store
    keys = inner.iter_keys(name) if hasattr(inner, "iter_keys") else iter(inner.list(name))
    first = next((k for k in keys if k.endswith(suffixes)), None)
    if first is None:
        raise StoreError(
            f"{location!r} does not exist or holds no {'/'.join(suffixes)} files; give a file "
            f"or folder of them (s3:// read with connection {s3_conn_id!r})")
    try:
        if isinstance(inner, LocalStore):
            with open(inner.uri(first), "rb") as fh:
                fh.read(1)
        elif not inner.exists(first):  # S3 HEAD needs the permission a read needs
            raise FileNotFoundError(inner.uri(first))
    except OSError as exc:
        raise StoreError(f"{location!r}: cannot read {inner.uri(first)} ({exc}); make it "
                         "readable by the Airflow workers") from None


class ReadOnlyStore:
    """Wrap a ``Store`` so that reads pass through and every write is refused."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.root = inner.root

    def uri(self, key: str) -> str:
        return self.inner.uri(key)

    def write_new(self, key: str, data: bytes) -> bool:
        raise self._refused(key)

    def write_new_concat(self, key: str, sources: Sequence[str]) -> tuple[int, str]:
        raise self._refused(key)

    def _refused(self, key: str) -> StoreError:
        return StoreError(
            f"{self.inner.uri(key)}: this store was opened read-only; open the output "
            "location with open_store(uri) to write"
        )

    def read(self, key: str) -> bytes:
        return self.inner.read(key)

    def iter_lines(self, key: str) -> Iterator[bytes]:
        return self.inner.iter_lines(key)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def list(self, prefix: str) -> list[str]:
        return self.inner.list(prefix)

    def list_children(self, prefix: str) -> tuple[list[str], list[str]]:
        return self.inner.list_children(prefix)
