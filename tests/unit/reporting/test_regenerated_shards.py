"""The report shows which shards a forced regeneration generated again, and why."""

from __future__ import annotations

from include.reporting.build import regenerated_shards
from include.reporting.collect import ShardFacts


def test_regenerated_shards_and_their_reasons_are_listed() -> None:
    forced = ShardFacts("shard-00003", False)
    forced.generated = {"generation": {"regeneration": {
        "reason": "force_regenerate: settings differ from the earlier journal: temperature "
                  "0.6 → 1.0", "earlier_journal": "journal/shard-00003.settings.json"}}}
    plain = ShardFacts("shard-00004", False)
    plain.generated = {"generation": {"settings_fingerprint": "abc"}}
    got = regenerated_shards([forced, plain, ShardFacts("shard-00005", True)])
    assert got == [{"shard": "shard-00003", "reason": forced.generated["generation"][
        "regeneration"]["reason"], "earlier_journal": "journal/shard-00003.settings.json"}]
    assert regenerated_shards([plain]) == []
