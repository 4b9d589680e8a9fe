"""The prepare stage: read the source datasets, filter, dedupe, sample, cut into shards."""

from include.prompts.errors import PrepareError
from include.prompts.funnel import PREPARE_DROP_REASONS, format_funnel
from include.prompts.prepare import prepare_prompts
from include.prompts.shards import read_shard, read_shard_by_id

__all__ = [
    "PREPARE_DROP_REASONS",
    "PrepareError",
    "format_funnel",
    "prepare_prompts",
    "read_shard",
    "read_shard_by_id",
]
