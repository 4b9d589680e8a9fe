"""The prepare stage: read the source datasets, filter, dedupe, sample, cut into shards."""

from include.prompts.prepare import (
    DROP_REASONS,
    MANIFEST_KEY,
    PrepareError,
    format_funnel,
    prepare_prompts,
    read_shard,
    read_shard_by_id,
    shard_id,
    shard_key,
)

__all__ = [
    "DROP_REASONS",
    "MANIFEST_KEY",
    "PrepareError",
    "format_funnel",
    "prepare_prompts",
    "read_shard",
    "read_shard_by_id",
    "shard_id",
    "shard_key",
]
