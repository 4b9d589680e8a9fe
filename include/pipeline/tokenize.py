"""``shard.tokenize``: a published shard into ``input_ids`` + ``loss_mask``, checked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from include.pipeline.run import bind, open_run_store


def run(shard_id: str, outputs_uri: str, params: Mapping[str, Any] | None) -> str:
    """The tokenize task: tokenize the shard, token by token against the server's ids;
    return the shard id."""
    from include.tokenization.stage import tokenize_run_shard

    settings = bind(params)
    tokenize_run_shard(settings, shard_id, open_run_store(settings, outputs_uri))
    return shard_id
