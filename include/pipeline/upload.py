"""``shard.upload``: publish a shard's completions create-only, checksummed and fenced."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from include.pipeline.run import bind, open_run_store


def run(shard_id: str, generated: dict[str, Any], outputs_uri: str,
        params: Mapping[str, Any] | None) -> str:
    """The upload task: build the shard's file from its journal and publish it; return the
    shard id (the generate summary's lease token fences a taken-over try)."""
    from include.generation.shard import publish_shard

    settings = bind(params)
    publish_shard(shard_id, open_run_store(settings, outputs_uri), open_run_store(settings),
                  generated)
    return shard_id
