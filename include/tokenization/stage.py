"""The tokenization stage: a shard's completion records in, training-ready samples published.

Its parts, one module each: ``assembly`` (a record's texts in the chat template's layout),
``chat`` (the target tokenizer and what is derived from it once), ``checks`` (encoding and
every check, ``tokenize_completions``), ``outputs`` (samples, the records kept out, and
their files) and ``conversations`` (whole conversations' rows). The target's tokenizer, shared
with the other stages, is ``include.target_tokenizer``.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from include.layout import generated_keys, pretokenized_key, shard_index, tokenized_keys
from include.layout import shard_id as shard_name
from include.target_tokenizer import load_tokenizer
from include.tokenization.assembly import TokenizeOptions
from include.tokenization.chat import ChatTokenizer
from include.tokenization.checks import tokenize_completions

log = logging.getLogger(__name__)


def tokenize_shard(
    store: Any,
    index: int,
    tokenizer: Any,
    options: TokenizeOptions | None = None,
    run_name: str | None = None,
) -> dict[str, Any]:
    """Tokenize shard ``index``'s completion records and publish its tokenized files.

    Every row records ``run_name`` and the shard (``shard-NNNNN``) among its provenance.
    Reads ``generated/shard-NNNNN.jsonl``, writes ``tokenized/shard-NNNNN.*`` and the trainer
    export ``pretokenized/shard-NNNNN.jsonl`` (keys from ``include.layout``), create-only
    through ``include.storage.publish_files``: a retry with the same inputs and settings
    rewrites nothing; the manifest (returned, counting every file) is written last.
    Raises ValueError if a line of the input is not JSON.
    """
    from include.storage.publish import publish_files

    source_key = generated_keys(index)[0]
    records = []
    for lineno, line in enumerate(store.read(source_key).splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError as exc:
                where = f"{store.uri(source_key)} line {lineno}"
                raise ValueError(f"{where}: not JSON ({exc})") from None
    result = tokenize_completions(tokenizer, records, options)
    result.origin = {"run_name": run_name, "shard": shard_name(index)}
    parquet_key, conv_key, manifest_key = tokenized_keys(index)
    manifest = {"shard": index, "source": source_key, **result.manifest()}
    published = publish_files(
        store,
        {parquet_key: result.to_parquet(), conv_key: result.conversations_jsonl(),
         pretokenized_key(index): result.pretokenized_jsonl()},
        manifest_key,
        manifest,
    )
    return published.manifest


@functools.lru_cache(maxsize=2)
def _chat_tokenizer(path: str) -> ChatTokenizer:
    return ChatTokenizer(load_tokenizer(path))


def tokenize_run_shard(settings: Any, shard_id: str, store: Any) -> dict[str, Any]:
    """Tokenize one shard of a run with the run's tokenizer and settings; return its manifest."""
    tokenizer = _chat_tokenizer(settings.tokenizer_path or settings.model_path)
    manifest = tokenize_shard(store, shard_index(shard_id), tokenizer,
                              TokenizeOptions.from_settings(settings),
                              run_name=getattr(settings, "run_name", None))
    log.info("%s: tokenized %s", shard_id, json.dumps(manifest["counts"]))
    return manifest
