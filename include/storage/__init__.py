"""Where a run's files live: one create-only interface over a local directory or S3."""

from include.storage.base import Store, sha256_hex
from include.storage.errors import ObjectExistsError, StoreError
from include.storage.locations import (
    DEFAULT_PROTECTED_PREFIXES,
    check_protected_prefixes,
    normalize_location,
    validate_output_location,
)
from include.storage.publish import (
    PublishResult,
    encode_manifest,
    publish_files,
    publish_generated_shard,
    write_verified,
)
from include.storage.s3 import S3Store, make_s3_client, split_s3_uri
from include.storage.store import (
    LocalStore,
    ReadOnlyStore,
    check_readable,
    open_readable,
    open_store,
)

__all__ = [
    "DEFAULT_PROTECTED_PREFIXES",
    "LocalStore",
    "ObjectExistsError",
    "PublishResult",
    "S3Store",
    "ReadOnlyStore",
    "Store",
    "StoreError",
    "check_protected_prefixes",
    "check_readable",
    "encode_manifest",
    "make_s3_client",
    "normalize_location",
    "publish_files",
    "publish_generated_shard",
    "open_readable",
    "open_store",
    "sha256_hex",
    "split_s3_uri",
    "validate_output_location",
    "write_verified",
]
