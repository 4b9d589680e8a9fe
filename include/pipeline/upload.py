"""``shard.upload``: publish a shard's completions create-only, checksummed and fenced."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from include.layout import Split
from include.pipeline.binding import bind, fail_without_retry, shard_stores, trusted_outputs_uri


def run(shard_id: str, generated: dict[str, Any], outputs_uri: str,
        params: Mapping[str, Any] | None, run_id: str | None = None,
        split: str = Split.TRAIN) -> str:
    """The upload task: publish the shard's file, fenced by the generate summary's lease token;
    return the shard id (where outputs go: ``binding.trusted_outputs_uri``)."""
    from include.generation.shard import publish_shard
    from include.servers.launch_report import XComMismatchError

    settings = bind(params)
    with fail_without_retry(XComMismatchError):
        outputs = trusted_outputs_uri(settings, run_id, outputs_uri)
        outputs_store, prompts_store = shard_stores(settings, outputs, split)
    publish_shard(shard_id, outputs_store, prompts_store, generated)
    return shard_id
