"""Multipart uploads for ``S3Store``: checksummed parts, a create-only (conditional) completion.

The condition (``If-None-Match: *``) is sent on CompleteMultipartUpload, the call that makes
the object exist: a store that honoured it on PutObject only would let two racing large
writes of one key both succeed, which is why the create-only probe (``probe.py``) also
completes an upload over an existing key. Apart from ``s3.py`` so that a whole upload, and
the way parts are cut from a stream, read in one place.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from include.storage.s3_errors import ConditionalConflict, error_code

log = logging.getLogger(__name__)

#: S3 takes at most this many parts in one upload.
MAX_PARTS = 10_000


def part_size_for(total: int, part_size: int) -> int:
    """Return ``part_size``, raised so that ``total`` bytes fit in ``MAX_PARTS`` parts."""
    return max(part_size, -(-total // MAX_PARTS))


def cut_parts(chunks: Iterable[bytes], size: int) -> Iterator[bytes]:
    """Yield ``size``-byte parts (the last one shorter) of a stream that arrives in chunks.

    Holds at most one part and one chunk: a concatenation of gigabytes streams through.
    """
    pending = bytearray()
    for chunk in chunks:
        pending += chunk
        while len(pending) >= size:
            with memoryview(pending) as view:
                part = bytes(view[:size])  # one copy (a bytearray slice would make two)
            del pending[:size]
            yield part
    if pending:
        yield bytes(pending)


def hashed(chunks: Iterable[bytes], digest: Any) -> Iterator[bytes]:
    """Yield ``chunks`` unchanged, fed to ``digest`` (a hashlib object) on the way."""
    for chunk in chunks:
        digest.update(chunk)
        yield chunk


def composite_sha256(part_digests: list[bytes]) -> str:
    """Return the checksum S3 reports for a multipart object: SHA-256 of the parts' digests."""
    whole = hashlib.sha256(b"".join(part_digests)).digest()
    return f"{base64.b64encode(whole).decode()}-{len(part_digests)}"


def upload_parts(client: Any, bucket: str, key: str, parts: Iterable[bytes],
                 metadata: dict[str, str]) -> tuple[dict[str, Any] | None, str]:
    """Upload ``parts`` as the object ``key``, completed only if ``key`` does not exist.

    Return the completion response and the composite checksum of the parts sent; ``(None,
    "")`` when the store refused the completion because ``key`` exists (412). Raise
    ConditionalConflict on 409 (a concurrent conditional write: retry), and whatever boto
    raised otherwise. The upload is aborted on any failure, so no parts linger.
    """
    from botocore.exceptions import ClientError

    upload_id = client.create_multipart_upload(
        Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256", Metadata=metadata)["UploadId"]
    try:
        sent: list[dict[str, Any]] = []
        digests: list[bytes] = []
        for number, part in enumerate(parts, 1):
            digest = hashlib.sha256(part).digest()
            part_sum = base64.b64encode(digest).decode()
            reply = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id,
                                       PartNumber=number, Body=part, ChecksumSHA256=part_sum)
            sent.append({"PartNumber": number, "ETag": reply["ETag"],
                         "ChecksumSHA256": reply.get("ChecksumSHA256") or part_sum})
            digests.append(digest)
        response = client.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": sent},
            IfNoneMatch="*")
    except ClientError as exc:
        _abort(client, bucket, key, upload_id)
        code = error_code(exc)
        if code == "PreconditionFailed":
            return None, ""
        if code == "ConditionalRequestConflict":
            raise ConditionalConflict from exc
        raise
    except BaseException:
        _abort(client, bucket, key, upload_id)
        raise
    return response, composite_sha256(digests)


def _abort(client: Any, bucket: str, key: str, upload_id: str) -> None:
    try:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
    except Exception:  # best effort: a lifecycle rule cleans up leftovers
        log.warning("could not abort multipart upload %s of %s", upload_id, key)
