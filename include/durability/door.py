"""The one door to durability: ``ShardDurability``, all the shard stage calls of this package.

Four methods (``published``, ``open``, ``progress``, ``publish``); the lease, the claims, the
fencing and the settings record stay behind them. Why there is one writer per shard and how
a lost holder is fenced out: the package docstring (``include.durability``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from include.durability.claims import wait_for_turn
from include.durability.journal import (
    Journal,
    StoreJournal,
    compact,
    merge_lines,
    prompt_records,
    read_segments,
)
from include.durability.journal_settings import (
    check_shard_journal,
    record_shard_settings,
    regeneration_reason,
)
from include.durability.lease import LEASE_TTL_S, Lease, check_token
from include.layout import shard_keys
from include.outcomes import PromptStatus
from include.storage import Store

if TYPE_CHECKING:
    from include.settings import RunSettings

log = logging.getLogger(__name__)

#: What ``publish`` asks the stage to make of the shard's final records: the completions
#: file, its manifest and the report's facts.
Build = Callable[[dict[str, dict[str, Any]]], tuple[bytes, dict[str, Any], bytes]]


@dataclass
class Progress:
    """How far a shard is, as another shard waiting on it sees it (``progress``)."""

    published: bool
    started: bool
    finished: int


class ShardDurability:
    """One shard's durability: its journal, its turn as the one writer, its publication."""

    store: Store
    #: After ``open``: what the summary carries (the settings fingerprint, a regeneration's
    #: reason, and the lease token once confirmed on a clean exit).
    stamp: dict[str, Any]

    def __init__(self, store: Store, shard: str) -> None:
        self.store = store
        self.keys = shard_keys(shard)
        self.stamp = {}
        # ``progress``: segments never change once written, so each is read once.
        self._read: set[str] = set()
        self._finished: dict[str, dict[str, Any]] = {}

    def published(self, settings: RunSettings | None = None) -> dict[str, Any] | None:
        """Return the shard's published manifest, or None. With ``settings``, first refuse
        (JournalSettingsError) a journal written under other completion settings: a shard
        done or half done under them is never taken for this run's."""
        if settings is not None:
            check_shard_journal(settings, self.store, self.keys.shard)
        if not self.store.exists(self.keys.manifest):
            return None
        return json.loads(self.store.read(self.keys.manifest))

    @contextmanager
    def open(self, settings: RunSettings, *, run_id: str | None = None,
             is_live: Callable[[str], bool] | None = None, ttl_s: float | None = None,
             earlier: Store | None = None) -> Iterator[Journal | None]:
        """Take the shard's turn, record its settings, and yield its fenced journal.

        With ``run_id`` (every Airflow try) the turn is the shard's lease, waited for and
        renewed while the block runs; None is yielded when the shard was published meanwhile
        (nothing to write). Without it (the CLI, tests) there is no lease, as the operator
        chose. On a clean exit the journal is flushed and the lease confirmed with the store
        before it is released complete; on an error it is released unfinished. ``earlier``:
        where the prompts are; a ``force_regenerate`` writing elsewhere records why.
        """
        ttl = LEASE_TTL_S if ttl_s is None else ttl_s
        lease: Lease | None = None
        if run_id is not None:
            lease = wait_for_turn(self.store, self.keys.shard, self.keys.journal, run_id,
                                  is_live, done=lambda: self.store.exists(self.keys.manifest),
                                  poll_s=min(5.0, ttl / 4), ttl_s=ttl)
            if lease is None:
                yield None
                return
        complete = False
        try:
            journal = self._start(settings, lease, earlier)
            try:
                yield journal
            finally:
                journal.close()
            if lease is not None:
                lease.confirm()  # checked before the summary vouches for the journal
                self.stamp["lease"] = lease.token
            complete = True
        finally:
            if lease is not None:
                lease.release(complete)

    def _start(self, settings: RunSettings, lease: Lease | None,
               earlier: Store | None) -> StoreJournal:
        if lease is not None:
            lease.check()  # no start marker from a holder that lost the shard
        extra = {}
        if settings.force_regenerate and earlier is not None and earlier.root != self.store.root:
            # The run's own location holds the journal this regeneration replaces.
            extra["regeneration"] = {
                "reason": regeneration_reason(settings, earlier, self.keys.shard),
                "earlier_journal": earlier.uri(self.keys.journal)}
        record = record_shard_settings(settings, self.store, self.keys.shard, **extra)
        self.stamp = {"settings_fingerprint": record["fingerprint"],
                      **({"regeneration": record["regeneration"]}
                         if "regeneration" in record else {})}
        self.store.write_new(self.keys.started, b"")
        return StoreJournal(self.store, self.keys.journal,
                            fence=lease.check if lease else None,
                            tag=f"{lease.generation:08d}" if lease else "")

    def progress(self) -> Progress:
        """Return whether the shard is published, started, and how many prompts it finished
        (its journal's new segments read once each)."""
        if self.store.exists(self.keys.manifest):
            return Progress(True, True, len(self._finished))
        if not self.store.exists(self.keys.started):
            return Progress(False, False, 0)
        for key in self.store.list(self.keys.journal):
            if key.endswith(".jsonl") and key not in self._read:
                self._read.add(key)
                merge_lines(self.store.read(key).splitlines(), self._finished)
        return Progress(False, True, len(self._finished))

    def publish(self, token: dict[str, Any] | None, build: Build) -> dict[str, Any]:
        """Publish the shard create-only from its journal; return its manifest.

        ``build`` makes the files of the final records. A shard already published is
        returned as it is (a retry never rewrites it). A lease ``token`` (the generate
        summary's) is fenced: LeaseLost, nothing written, when a newer generation was taken
        since; it is checked again just before the write and recorded in the manifest.
        """
        from include.storage.publish import publish_generated_shard

        shard = self.keys.shard
        manifest = self.published()
        if manifest is not None:
            log.info("%s: already published at %s", shard, self.store.uri(self.keys.manifest))
            self._compact()  # a retry after a compaction that failed
            return manifest
        if token:
            check_token(self.store, self.keys.journal, token["generation"], shard)
        segments = read_segments(self.store, self.keys.journal)
        records: dict[str, dict[str, Any]] = {}
        for _, lines in segments:
            merge_lines(lines.splitlines(), records)
        data, manifest, facts = build(prompt_records(records))
        if token:
            # Again after the journal read, which can take a while. Past this point a newer
            # holder appears only if this run ended or its generate task was cleared (see
            # claims), and the manifest is create-only: one version is ever published.
            check_token(self.store, self.keys.journal, token["generation"], shard)
            manifest["lease"] = {"generation": token["generation"], "holder": token["holder"]}
        result = publish_generated_shard(self.store, self.keys.index, data, manifest, facts)
        counts = manifest["counts"]
        log.info("%s: published %d completions (%d skipped, %d failed) to %s", shard,
                 counts[PromptStatus.COMPLETED], counts[PromptStatus.SKIPPED],
                 counts[PromptStatus.FAILED], self.store.uri(self.keys.completions))
        self._compact(segments)
        return result.manifest

    def _compact(self, segments: list[tuple[str, bytes]] | None = None) -> None:
        # An optimisation for readers, never a failure: the segments still hold the journal.
        try:
            compact(self.store, self.keys.journal, segments)
        except Exception as exc:  # noqa: BLE001
            log.warning("%s: compacting the journal failed (%s); readers use its segments",
                        self.keys.shard, exc)
