"""The report reads each shard's facts, not its rows (issue 28), and says the same.

At the planned size (655 shards of 1,000 prompts) the journals the report read are gigabytes
of JSON with every completion's text and token ids, and each tokenized parquet megabytes of
ids for two scalar columns: one task read all of it at the run's end. Now the upload task
writes ``generated/<shard>.facts.json`` and the tokenize task the samples' lengths into its
manifest; shards published before them are read as they were."""

from __future__ import annotations

import json

import pytest

from include.layout import facts_key, generated_keys, report_prefix
from include.reporting import QualityGates, build_report
from include.reporting.collect import collect_shard
from include.reporting.facts import decode_facts, encode_facts
from include.storage import LocalStore, StoreError
from tests.fixtures.settings import run_settings
from tests.unit.reporting.synthetic_run import ShardSpec, write_run

LOOSE = QualityGates(max_truncation_rate=1.0, max_failure_rate=1.0, max_quarantine_rate=1.0)


def _shards(before_facts: bool) -> dict[str, ShardSpec]:
    return {
        "shard-00000": ShardSpec(completed=20, truncated=2, skipped=1, failed=2, quarantined=1,
                                 retried=3, before_facts=before_facts,
                                 extra={"server_version": "0.5.23", "usage": {
                                     "prompt_tokens": 7, "completion_tokens": 9,
                                     "reasoning_tokens": 4}}),
        "shard-00001": ShardSpec(completed=30, truncated=6, sources=("alpha", "beta", "gamma"),
                                 before_facts=before_facts),
    }


class CountingStore(LocalStore):
    """A local store that records every key it reads."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.reads: list[str] = []

    def read(self, key: str) -> bytes:
        self.reads.append(key)
        return super().read(key)


def _report(tmp_path, before_facts: bool) -> tuple[dict, list[str]]:
    store = CountingStore(str(tmp_path / ("old" if before_facts else "new")))
    shards = _shards(before_facts)
    write_run(store, shards)
    settings = run_settings({"run_name": "syn"}, output_root=str(tmp_path))
    store.reads.clear()
    build_report(settings, store, store, list(shards), [], run_id="r", gates=LOOSE,
                 plots=False)
    report = json.loads(store.read(report_prefix("r") + "report.json"))
    return report, store.reads


def test_the_report_from_facts_is_the_report_from_the_rows(tmp_path) -> None:
    new, new_reads = _report(tmp_path, before_facts=False)
    old, old_reads = _report(tmp_path, before_facts=True)
    for report in (new, old):  # where each run's files are: not a figure
        for key in ("report_uri", "outputs_uri", "dataset_card", "trainer_export"):
            report.pop(key, None)
        report["run"].pop("outputs_uri")
    assert new == old
    # The rows are no longer read: no journal segment, no parquet.
    assert not [k for k in new_reads if k.startswith("journal/") or k.endswith(".parquet")]
    assert [k for k in old_reads if k.startswith("journal/")]
    assert [k for k in old_reads if k.endswith(".parquet")]
    assert sorted(k for k in new_reads if k.endswith(".facts.json")) == [
        "generated/shard-00000.facts.json", "generated/shard-00001.facts.json"]


def test_facts_are_checksummed_by_the_manifest_and_identical_when_rebuilt(tmp_path) -> None:
    store = LocalStore(str(tmp_path / "run"))
    write_run(store, _shards(False))
    manifest = json.loads(store.read(generated_keys(0)[1]))
    data = store.read(facts_key(0))
    assert manifest["files"][facts_key(0)]["bytes"] == len(data)
    facts = collect_shard(store, "shard-00000", False)
    completions, failed = decode_facts(data)
    assert completions == sorted(facts.completions, key=lambda c: c.prompt_id)
    assert failed == [4, 4] and len(completions) == 20
    # The same records in another order give the same bytes (a retried upload).
    records = [{"id": c.prompt_id, "status": "completed", "source": c.source,
                "finish_reason": c.finish_reason, "timings": {"finished_at": c.finished_at}}
               for c in completions]
    assert encode_facts(records) == encode_facts(list(reversed(records)))
    # A changed facts file is refused, not counted.
    (tmp_path / "run" / facts_key(0)).write_bytes(data.replace(b'"alpha"', b'"gamma"', 1))
    with pytest.raises(StoreError, match="its manifest says"):
        collect_shard(store, "shard-00000", False)


def test_a_facts_file_of_another_format_is_read_from_the_journal(tmp_path,
                                                                 monkeypatch) -> None:
    from include.reporting import facts as facts_module

    store = CountingStore(str(tmp_path / "run"))
    write_run(store, _shards(False))
    written = collect_shard(store, "shard-00000", False)
    assert written.completions[0].server_version == "0.5.23"
    assert {c.reasoning_tokens for c in written.completions} == {4}
    monkeypatch.setattr(facts_module, "FACTS_VERSION", 2)  # a reader older than the file
    store.reads.clear()
    again = collect_shard(store, "shard-00000", False)
    assert [k for k in store.reads if k.startswith("journal/")]
    assert sorted(again.completions, key=lambda c: c.prompt_id) == sorted(
        written.completions, key=lambda c: c.prompt_id)
    assert sorted(again.failed_attempts) == sorted(written.failed_attempts)
