"""A shard of whole conversations publishes from its journal: per-turn records are not prompts.

Found by triggering a ``turns: all`` run on the Celery tier: the upload task read the
journal's turn records as unknown prompts and refused the shard.
"""

from __future__ import annotations

import json

import pytest

from include.durability.journal import StoreJournal, load_journal_records
from include.engine.dispatch import run_shard
from include.generation.shard import publish_shard
from include.layout import journal_prefix
from include.storage import LocalStore
from tests.integration.generation.helpers import (
    chat_prompt,
    engine_config,
    make_prompts,
    token_counter,
    write_shard,
)

pytestmark = pytest.mark.integration


def test_a_shard_of_conversations_publishes_each_conversation_once(
    standins, tokenizer_dir, tmp_path
) -> None:
    servers = standins(1)
    store = LocalStore(tmp_path)
    prompts = [chat_prompt(i) for i in range(5)] + make_prompts(3)
    write_shard(store, prompts)
    journal = StoreJournal(store, journal_prefix("shard-00000"))
    outcome = run_shard("shard-00000", prompts, [s.url for s in servers], journal,
                        engine_config(), token_counter(tokenizer_dir))
    journal.close()
    assert outcome.conversations["turns"] == 15
    manifest = publish_shard("shard-00000", store)
    assert manifest["counts"] == {"completed": 8, "skipped": 0, "failed": 0}
    lines = [json.loads(x) for x in store.read("generated/shard-00000.jsonl").splitlines()]
    assert sorted(r["id"] for r in lines) == sorted(p["id"] for p in prompts)
    assert all(len(r["turn_results"]) == 3 for r in lines if r["id"].startswith("chat:"))
    assert set(load_journal_records(store, "shard-00000")) == {p["id"] for p in prompts}
