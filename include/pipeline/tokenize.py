"""``shard.tokenize``: a published shard into ``input_ids`` + ``loss_mask``, checked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from include.layout import Split
from include.pipeline.binding import (
    bind,
    fail_without_retry,
    open_run_store,
    shard_locations,
    trusted_outputs_uri,
)


def run(shard_id: str, outputs_uri: str, params: Mapping[str, Any] | None,
        run_id: str | None = None, split: str = Split.TRAIN) -> str:
    """The tokenize task: tokenize the shard, token by token against the server's ids; return
    the shard id (where outputs go: ``binding.trusted_outputs_uri``)."""
    from include.servers.launch_report import XComMismatchError
    from include.tokenization.stage import tokenize_run_shard

    settings = bind(params)
    with fail_without_retry(XComMismatchError):
        outputs = trusted_outputs_uri(settings, run_id, outputs_uri)
        outputs, _ = shard_locations(settings, outputs, split)
    tokenize_run_shard(settings, shard_id, open_run_store(settings, outputs))
    return shard_id
