"""Durability: a shard's journal, one writer at a time, and what a resume may read.

``journal`` (segments of finished prompts), ``lease`` and ``claims`` (one writer per shard,
waiting for a turn), ``fencing`` (which segments count after a takeover),
``journal_settings`` (the completion settings a journal is written under).
"""
