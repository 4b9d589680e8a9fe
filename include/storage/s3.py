"""Create-only object storage on S3 (or any S3-compatible endpoint) behind the ``Store`` protocol.

Every write is conditional (``If-None-Match: *``), so a key that exists is never replaced,
not even by a racing writer: S3 answers 412 and this store then compares the existing object
with the new bytes (identical: the write counts as done; different: ``ObjectExistsError``).
Objects above ``multipart_threshold`` go up in parts with the condition on the completing call
(``s3_upload.py``).
Each object carries its SHA-256 in user metadata (``x-amz-meta-sha256``) and is verified after
upload (the server's SHA-256 checksum when it returns one, otherwise a read-back).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, BinaryIO

from include.storage.base import copy_hashed, read_chunks, split_lines
from include.storage.errors import ObjectExistsError, StoreError
from include.storage.locations import check_write
from include.storage.s3_client import make_s3_client, split_s3_uri
from include.storage.s3_errors import (
    NOT_FOUND_CODES,
    ConditionalConflict,
    error_code,
    store_error,
)
from include.storage.s3_upload import cut_parts, hashed, part_size_for, upload_parts

log = logging.getLogger(__name__)

MiB = 1024 * 1024
#: S3 refuses parts below 5 MiB (except the last one).
MIN_PART_SIZE = 5 * MiB
DEFAULT_MULTIPART_THRESHOLD = 64 * MiB
DEFAULT_PART_SIZE = 16 * MiB
_READ_CHUNK = 8 * MiB
#: Reads that parts are cut from: small, so a part's buffer stays near the part size.
_STREAM_CHUNK = MiB
#: Retries of a conditional write that S3 answered with 409 ConditionalRequestConflict (a
#: concurrent conditional write of the same key was in flight).
_CONFLICT_RETRIES = 5


class S3Store:
    """A ``Store`` over ``s3://bucket/prefix``: create-only, verified, paginated listing."""

    verifies_writes = True
    #: Protected prefixes every key written is checked against (set by ``open_store``).
    protected: tuple[str, ...] = ()

    def __init__(
        self,
        root: str,
        *,
        client: Any | None = None,
        conn_id: str | None = "aws_default",
        endpoint_url: str | None = None,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        part_size: int = DEFAULT_PART_SIZE,
    ) -> None:
        """Open ``root``; no request is sent until ``check_access`` or the first operation.

        ``client`` wins over ``conn_id``/``endpoint_url`` (see ``make_s3_client``).
        ``part_size`` is raised to S3's 5 MiB minimum.
        """
        self.bucket, self.prefix = split_s3_uri(root)
        self.root = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.conn_id = conn_id
        self.client = client if client is not None else make_s3_client(conn_id, endpoint_url)
        self.multipart_threshold = multipart_threshold
        self.part_size = max(part_size, MIN_PART_SIZE)

    # --- naming ---------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        """Return the endpoint URL requests go to (for error messages)."""
        return str(getattr(getattr(self.client, "meta", None), "endpoint_url", "?"))

    def _key(self, key: str) -> str:
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in key.split("/")):
            raise StoreError(f"refusing key {key!r}: keys are relative and never leave the root")
        return f"{self.prefix}/{key}" if self.prefix else key

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    # --- errors ---------------------------------------------------------------------------
    def _error(self, exc: Exception, action: str, key: str | None = None, *,
               conditional: bool = False) -> StoreError:
        """Return a StoreError that names endpoint, bucket, location and the fix.

        ``conditional``: the failed request carried ``If-None-Match: *``.
        """
        return store_error(
            exc, action, self.uri(key) if key else self.root, endpoint=self.endpoint,
            bucket=self.bucket, conn_id=self.conn_id, about_bucket=key is None,
            conditional=conditional,
        )  # fmt: skip

    def check_access(self) -> None:
        """Raise StoreError now if the bucket is missing or the credentials are refused.

        Call it before any work so that a misconfiguration fails the task at its start.
        """
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except Exception as exc:
            raise self._error(exc, "opening") from exc

    # --- reads ----------------------------------------------------------------------------
    def read(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        full = self._key(key)
        try:
            return self.client.get_object(Bucket=self.bucket, Key=full)["Body"].read()
        except ClientError as exc:
            if error_code(exc) in NOT_FOUND_CODES:
                raise FileNotFoundError(self.uri(key)) from None
            raise self._error(exc, "reading", key) from exc
        except Exception as exc:
            raise self._error(exc, "reading", key) from exc

    def iter_lines(self, key: str) -> Iterator[bytes]:
        """Yield the object's lines as it streams in (never the whole object in memory)."""
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        except Exception as exc:
            if error_code(exc) in NOT_FOUND_CODES:
                raise FileNotFoundError(self.uri(key)) from None
            raise self._error(exc, "reading", key) from exc
        yield from split_lines(iter(lambda: body.read(_READ_CHUNK), b""), self.uri(key))

    def _head(self, key: str) -> dict[str, Any] | None:
        from botocore.exceptions import ClientError

        try:
            return self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if error_code(exc) in NOT_FOUND_CODES:
                return None
            raise self._error(exc, "inspecting", key) from exc
        except Exception as exc:
            raise self._error(exc, "inspecting", key) from exc

    def exists(self, key: str) -> bool:
        return self._head(key) is not None

    def stored_sha256(self, key: str) -> str:
        """Return the SHA-256 of the object's bytes, hashed while streaming it back."""
        digest = hashlib.sha256()
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
            for chunk in iter(lambda: body.read(_READ_CHUNK), b""):
                digest.update(chunk)
        except Exception as exc:
            if error_code(exc) in NOT_FOUND_CODES:
                raise FileNotFoundError(self.uri(key)) from None
            raise self._error(exc, "reading", key) from exc
        return digest.hexdigest()

    def iter_keys(
        self, prefix: str = "", *, start_after: str | None = None, page_size: int = 1000
    ) -> Iterator[str]:
        """Yield keys under ``prefix`` in S3 order (sorted), one page at a time.

        ``prefix`` is a folder (``a`` lists ``a/...`` and a key ``a`` itself, not ``ab``).
        ``start_after`` (a key relative to the root) resumes a listing, so a reader polling
        a growing folder (e.g. journal parts) lists only what is new.
        """
        base = f"{self.prefix}/" if self.prefix else ""
        folder = prefix.rstrip("/")
        s3_prefix = base + folder
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": s3_prefix}
        if start_after:
            kwargs["StartAfter"] = base + start_after
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                **kwargs, PaginationConfig={"PageSize": page_size}
            )
            for page in pages:
                for obj in page.get("Contents", ()):
                    rel = obj["Key"][len(base) :]
                    if not folder or rel == folder or rel.startswith(folder + "/"):
                        yield rel
        except Exception as exc:
            raise self._error(exc, "listing", prefix or None) from exc

    def list(self, prefix: str) -> list[str]:
        return sorted(self.iter_keys(prefix))

    def list_children(self, prefix: str, *, page_size: int = 1000
                      ) -> tuple[list[str], list[str]]:
        base = f"{self.prefix}/" if self.prefix else ""
        folder = prefix.strip("/")
        s3_prefix = base + (f"{folder}/" if folder else "")
        keys: list[str] = []
        subs: list[str] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=s3_prefix, Delimiter="/",
                PaginationConfig={"PageSize": page_size})
            for page in pages:
                keys += [obj["Key"][len(base):] for obj in page.get("Contents", ())
                         if obj["Key"] != s3_prefix]  # a console's "folder" marker
                subs += [p["Prefix"][len(base):] for p in page.get("CommonPrefixes", ())]
        except Exception as exc:
            raise self._error(exc, "listing", folder or None) from exc
        return sorted(keys), sorted(subs)

    # --- writes ---------------------------------------------------------------------------
    def write_new(self, key: str, data: bytes) -> bool:
        full = self._key(key)
        check_write(self.uri(key), self.protected)
        digest = hashlib.sha256(data).digest()
        sha_hex = digest.hex()
        for attempt in range(_CONFLICT_RETRIES + 1):
            try:
                if len(data) > self.multipart_threshold:
                    created, composite = self._put_multipart(full, data, sha_hex)
                else:
                    created, composite = self._put_single(full, data, digest), ""
            except ConditionalConflict:
                # Another conditional write of this key is in flight; S3 asks us to retry.
                time.sleep(0.05 * 2**attempt)
                continue
            if not created:
                return self._settle_existing(key, len(data), sha_hex)
            self._verify(key, sha_hex, created, composite)
            return True
        raise self._kept_conflicting(key)

    def write_new_concat(self, key: str, sources: Sequence[str]) -> tuple[int, str]:
        full = self._key(key)
        check_write(self.uri(key), self.protected)
        total = sum(self._source_size(source, key) for source in sources)
        if total <= self.multipart_threshold:  # small: one conditional PUT, as write_new
            data = b"".join(read_chunks(self._open_source(s, key) for s in sources))
            self.write_new(key, data)
            return len(data), hashlib.sha256(data).hexdigest()
        if self._head(key) is not None:  # a retried task: compare, without re-uploading
            size, sha_hex = copy_hashed((self._open_source(s, key) for s in sources), len)
            self._settle_existing(key, size, sha_hex)
            return size, sha_hex
        for attempt in range(_CONFLICT_RETRIES + 1):
            whole = hashlib.sha256()
            stream = read_chunks((self._open_source(s, key) for s in sources), _STREAM_CHUNK)
            parts = cut_parts(hashed(stream, whole), part_size_for(total, self.part_size))
            try:
                # The whole's hash is known only at the end, so this object carries no
                # sha256 metadata; the composite checksum verifies it instead.
                created, composite = self._upload(full, parts, {})
            except ConditionalConflict:
                time.sleep(0.05 * 2**attempt)
                continue
            if not created:
                self._settle_existing(key, total, whole.hexdigest())
            else:
                self._verify(key, whole.hexdigest(), created, composite)
            return total, whole.hexdigest()
        raise self._kept_conflicting(key)

    def _source_size(self, source: str, key: str) -> int:
        head = self._head(source)
        if head is None:
            raise FileNotFoundError(f"{self.uri(source)}: no such object (a source of "
                                    f"{self.uri(key)})")
        return int(head["ContentLength"])

    def _open_source(self, source: str, key: str) -> BinaryIO:
        try:
            body: BinaryIO = self.client.get_object(
                Bucket=self.bucket, Key=self._key(source))["Body"]
            return body
        except Exception as exc:
            if error_code(exc) in NOT_FOUND_CODES:
                raise FileNotFoundError(f"{self.uri(source)}: no such object (a source of "
                                        f"{self.uri(key)})") from None
            raise self._error(exc, "reading", source) from exc

    def _kept_conflicting(self, key: str) -> StoreError:
        return StoreError(
            f"writing {self.uri(key)}: S3 kept answering ConditionalRequestConflict; another "
            "writer is writing this key right now. Retry the task."
        )

    def try_create(self, key: str, data: bytes, *, multipart: bool = False) -> bool:
        """Write ``key`` with ``If-None-Match: *`` once; return whether the store took it.

        Only for ``include.storage.probe``: False means the store refused the key as existing,
        as a create-only store must on a second write. ``multipart``: as a one-part upload,
        the condition on its completion. Nothing is verified or compared.
        """
        check_write(self.uri(key), self.protected)
        full = self._key(key)
        for attempt in range(_CONFLICT_RETRIES + 1):
            try:
                if multipart:
                    return self._upload(full, [data], {})[0] is not None
                return self._put_single(full, data, hashlib.sha256(data).digest()) is not None
            except ConditionalConflict:
                time.sleep(0.05 * 2**attempt)
        raise self._kept_conflicting(key)

    def _put_single(self, full: str, data: bytes, digest: bytes) -> dict[str, Any] | None:
        """Return the put response, or None when the key already exists (412)."""
        from botocore.exceptions import ClientError

        try:
            return self.client.put_object(
                Bucket=self.bucket, Key=full, Body=data, IfNoneMatch="*",
                ChecksumSHA256=base64.b64encode(digest).decode(), Metadata={"sha256": digest.hex()})
        except ClientError as exc:
            code = error_code(exc)
            if code == "PreconditionFailed":
                return None
            if code == "ConditionalRequestConflict":
                raise ConditionalConflict from exc
            raise self._error(exc, "writing", self._rel(full), conditional=True) from exc
        except Exception as exc:
            raise self._error(exc, "writing", self._rel(full)) from exc

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def _put_multipart(self, full: str, data: bytes, sha_hex: str
                       ) -> tuple[dict[str, Any] | None, str]:
        """Upload in parts; return the completion and the composite checksum, or (None, "")
        when the key already exists."""
        # A retried task would otherwise re-upload gigabytes only to be refused at completion.
        if self._head(self._rel(full)) is not None:
            return None, ""
        size = part_size_for(len(data), self.part_size)
        view = memoryview(data)
        parts = (bytes(view[start : start + size]) for start in range(0, len(data), size))
        return self._upload(full, parts, {"sha256": sha_hex})

    def _upload(self, full: str, parts: Iterable[bytes], metadata: dict[str, str]
                ) -> tuple[dict[str, Any] | None, str]:
        """``upload_parts`` with its errors named (ConditionalConflict passes through)."""
        from botocore.exceptions import ClientError

        try:
            return upload_parts(self.client, self.bucket, full, parts, metadata)
        except (ConditionalConflict, FileNotFoundError, StoreError):
            raise  # a source's own error (named), or retry
        except ClientError as exc:
            conditional = getattr(exc, "operation_name", "") == "CompleteMultipartUpload"
            raise self._error(exc, "uploading", self._rel(full), conditional=conditional
                              ) from exc
        except Exception as exc:
            raise self._error(exc, "uploading", self._rel(full)) from exc

    def _settle_existing(self, key: str, size: int, sha_hex: str) -> bool:
        """Return False if ``key`` holds ``size`` bytes hashing to ``sha_hex``; raise
        ObjectExistsError otherwise."""
        head = self._head(key)
        if head is None:  # deleted between our attempt and now: not ours to recreate silently
            raise StoreError(f"writing {self.uri(key)}: refused as existing, then not found; retry")
        if head.get("ContentLength") != size:
            existing = head.get("Metadata", {}).get("sha256", "unknown")
        else:
            # Compare real bytes, not the recorded sha: the object may predate this store.
            existing = self.stored_sha256(key)
        if existing == sha_hex:
            return False
        raise ObjectExistsError(
            f"{self.uri(key)} already exists with different content (sha256 {existing}, new "
            f"{sha_hex}, {size} bytes); nothing was overwritten. Write to a new run_name "
            "(or output location) instead."
        )

    def _verify(self, key: str, sha_hex: str, response: dict[str, Any], composite: str) -> None:
        """Raise StoreError unless the stored object's SHA-256 is ``sha_hex``.

        ``composite``: the checksum of the parts sent, for a multipart upload ("" otherwise).
        """
        server_sum = response.get("ChecksumSHA256")
        expected_b64 = base64.b64encode(bytes.fromhex(sha_hex)).decode()
        if server_sum and server_sum in (expected_b64, composite):
            return  # the server hashed what it stored (the whole, or each part it stored)
        stored = self.stored_sha256(key)
        if stored != sha_hex:
            raise StoreError(
                f"{self.uri(key)}: stored object has sha256 {stored}, expected {sha_hex}; the "
                "upload was corrupted. Inspect the object before any retry (it is create-only)."
            )


__all__ = ["S3Store", "make_s3_client", "split_s3_uri"]
