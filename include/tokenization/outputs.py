"""What the tokenization stage writes: samples, the records kept out, and their three files.

A tokenized shard is published as ``tokenized/shard-NNNNN.parquet`` (the samples, each with
its provenance: ``provenance.py``), ``.conversations.jsonl`` (SpecForge-style conversations,
each message saying whether the target generated it in this run), ``.manifest.json`` (counts,
every record kept out with its reason, length statistics) and the trainer export
``pretokenized/shard-NNNNN.jsonl`` (the parquet's rows as the JSON lines SpecForge's
``prompts_path`` and speculators' pre-tokenized pass-through read as they are); see
docs/data-layout.md.
"""

from __future__ import annotations

import io
import json
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from include.jsonl import escape_breaks
from include.quality import QUALITY_FILTERS
from include.tokenization.provenance import PROVENANCE_COLUMNS, provenance_object

#: Why a record was kept out by an output quality filter (the completion is not worth
#: training on): each filter's name (include/quality). Also in ``QUARANTINE_REASONS``.
QUALITY_REASONS = QUALITY_FILTERS
#: Why a record was kept out because a check failed (the sample would be wrong), then the
#: quality filters' reasons.
QUARANTINE_REASONS = (
    "invalid_record",
    "unexpected_finish_reason",
    "template_mismatch",
    "no_raw_text",
    "server_ids_mismatch",
    "prompt_tokens_mismatch",
    "retokenized_count_mismatch",
    "decode_mismatch",
    "prompt_ids_mismatch",
    "masked_ids_mismatch",
    "mask_all_zero",
    "mask_all_one",
    *QUALITY_REASONS,
)
#: Where a sample's ids come from: the server's own, or the raw text encoded by the stage.
TOKEN_SOURCES = ("server", "text")
#: Why a record was kept out because a setting excludes it.
TOKENIZE_DROP_REASONS = ("truncated_completion", "over_length")


@dataclass
class Sample:
    """One training sample; ``loss_mask[i]`` is 1 where ``input_ids[i]`` was regenerated."""

    id: str
    source: str
    finish_reason: str
    input_ids: list[int]
    loss_mask: list[int]
    #: The request and the answer as messages (``role``, ``content``, ``generated``: whether
    #: the target wrote it in this run; the dataset's own turns are False).
    conversation: list[dict[str, Any]]
    token_source: str = "server"
    #: ``provenance.PROVENANCE_COLUMNS`` read off the record (run and shard from the result).
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return len(self.input_ids)


@dataclass
class TokenizeResult:
    """A tokenized shard in memory: samples, and every record that did not become one."""

    samples: list[Sample] = field(default_factory=list)
    quarantined: list[dict[str, str]] = field(default_factory=list)
    dropped: list[dict[str, str]] = field(default_factory=list)
    truncated_to_max_length: int = 0
    input_records: int = 0
    settings: dict[str, Any] = field(default_factory=dict)
    #: Samples written per ``TOKEN_SOURCES`` entry.
    token_source: Counter[str] = field(default_factory=Counter)
    #: Server rows whose text, encoded again, is not the sampled ids (counted, not enforced).
    retokenized_text_differs: int = 0
    #: Server rows whose prompt renders here to other ids than the server's.
    prompt_render_differs: int = 0
    #: Finished turns whose ids stop before the end-of-turn token (closed, untrained).
    closed_by_template: int = 0
    #: The run and shard the samples came from (``run_name``, ``shard``), set by the stage.
    origin: dict[str, str | None] = field(default_factory=dict)
    #: Whole conversations' counts; {} if none
    #: (``include.tokenization.conversations.ShardConversations.manifest``).
    conversations: dict[str, Any] = field(default_factory=dict)

    def provenance_rows(self) -> list[dict[str, Any]]:
        """Return each sample's provenance, every column present (None when unknown)."""
        names = [name for name, _ in PROVENANCE_COLUMNS]
        return [{n: {**s.provenance, **self.origin}.get(n) for n in names}
                for s in self.samples]

    def manifest(self) -> dict[str, Any]:
        """Return counts, quarantined/dropped ids with reasons, and length statistics.

        Deterministic (no times), so a retried shard publishes identical bytes.
        """
        quarantined = Counter(q["reason"] for q in self.quarantined)
        dropped = Counter(d["reason"] for d in self.dropped)
        by_source: dict[str, list[int]] = defaultdict(list)
        for s in self.samples:
            by_source[s.source].append(s.length)
        return {
            "counts": {
                "input": self.input_records,
                "written": len(self.samples),
                "quarantined": {r: quarantined.get(r, 0) for r in QUARANTINE_REASONS},
                "dropped": {r: dropped.get(r, 0) for r in TOKENIZE_DROP_REASONS},
                "truncated_to_max_length": self.truncated_to_max_length,
                "token_source": {k: self.token_source.get(k, 0) for k in TOKEN_SOURCES},
                "retokenized_text_differs": self.retokenized_text_differs,
                "prompt_render_differs": self.prompt_render_differs,
                "closed_by_template": self.closed_by_template,
            },
            "tokens": {
                "total": sum(s.length for s in self.samples),
                "loss": sum(sum(s.loss_mask) for s in self.samples),
            },
            "length_stats": {src: length_stats(v) for src, v in sorted(by_source.items())},
            # Every sample's length, by source: what the report counts of the rows, read
            # here instead of from the parquet (a few kilobytes against megabytes of ids).
            "lengths": {src: sorted(v) for src, v in sorted(by_source.items())},
            "quarantined": sorted(self.quarantined, key=lambda q: (q["id"], q["reason"])),
            "dropped": sorted(self.dropped, key=lambda d: (d["id"], d["reason"])),
            "settings": dict(self.settings),
            "text_path": self.text_path(),
            **({"conversations": self.conversations} if self.conversations else {}),
        }

    def text_path(self) -> dict[str, int]:
        """Return what a trainer that re-tokenizes the conversations file would change here.

        Every row: its end-of-turn gains the template's ``\n`` inside the loss (SpecForge's
        and speculators' templates end a turn with ``<|im_end|>\n``; the server stopped at
        ``<|im_end|>``). ``retokenized_text_differs``: answers whose text encodes to other ids
        than were sampled. ``without_system``: rows whose template would add a default system
        prompt (SpecForge's ``qwen``/``qwen3-thinking``). ``with_dataset_turns`` /
        ``dataset_turns``: rows holding assistant turns the dataset wrote (not the target),
        which a trainer that trains every assistant turn puts in the loss.
        """
        dataset_turns = [sum(1 for m in s.conversation if m["role"] == "assistant"
                             and not m.get("generated")) for s in self.samples]
        return {
            "rows": len(self.samples),
            "end_of_turn_newline": sum(1 for s in self.samples if s.finish_reason == "stop"),
            "retokenized_text_differs": self.retokenized_text_differs,
            "without_system": sum(1 for s in self.samples
                                  if not any(m["role"] == "system" for m in s.conversation)),
            "with_dataset_turns": sum(1 for n in dataset_turns if n),
            "dataset_turns": sum(dataset_turns),
        }

    def to_parquet(self) -> bytes:
        """Return the samples as one zstd parquet file (schema: ``parquet_schema()``)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        samples = self.samples
        lengths = np.array([s.length for s in samples], dtype=np.int32)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths, dtype=np.int32)]))
        # Flatten through numpy: pyarrow's own conversion of long Python int lists is slow.
        ids = np.array(list(chain.from_iterable(s.input_ids for s in samples)), dtype=np.int32)
        mask = np.array(list(chain.from_iterable(s.loss_mask for s in samples)), dtype=np.int8)
        rows = self.provenance_rows()
        schema = parquet_schema()
        extra = [pa.array([r[name] for r in rows], schema.field(name).type)
                 for name, _ in PROVENANCE_COLUMNS]
        table = pa.Table.from_arrays(
            [
                pa.ListArray.from_arrays(offsets, pa.array(ids)),
                pa.ListArray.from_arrays(offsets, pa.array(mask)),
                pa.array(lengths),
                pa.array([s.source for s in samples], pa.string()),
                pa.array([s.id for s in samples], pa.string()),
                pa.array([s.finish_reason for s in samples], pa.string()),
                pa.array([s.token_source for s in samples], pa.string()),
                *extra,
            ],
            schema=schema,
        )
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        return buf.getvalue()

    def conversations_jsonl(self) -> bytes:
        """Return SpecForge-style lines ``{"id", "conversations": [{"role", "content",
        "generated"}]}``, each with its row's ``provenance`` object beside them.

        ``generated`` marks the messages the target wrote in this run (the answer, and under
        ``turns: all`` its earlier turns); False marks the dataset's own. A trainer that reads
        this file tokenizes it again with its own template: ``text_path`` counts what that
        changes. The exact rows are the parquet and ``pretokenized/``.
        """
        lines = [
            escape_breaks(json.dumps(
                {"id": s.id, "conversations": s.conversation,
                 "provenance": provenance_object(row)},
                ensure_ascii=False, sort_keys=True,
            ))
            for s, row in zip(self.samples, self.provenance_rows(), strict=True)
        ]
        return ("\n".join(lines) + "\n").encode() if lines else b""

    def pretokenized_jsonl(self) -> bytes:
        """Return the trainer export: one line per parquet row, in the parquet's order.

        ``{"id", "input_ids", "loss_mask", "source", "run_name", "shard"}``: the two fields
        SpecForge (``data.prompts_path``, pre-tokenized when the first record has both) and
        speculators (``prepare_data``'s pass-through) read, and string fields that tie each
        row to its parquet row and provenance by ``id``. Every field is always present with
        one type, so a folder of these files loads as one ``datasets`` table.
        """
        origin = {k: str(v or "") for k, v in self.origin.items()}
        lines = [
            json.dumps({"id": s.id, "input_ids": s.input_ids, "loss_mask": s.loss_mask,
                        "source": s.source, "run_name": origin.get("run_name", ""),
                        "shard": origin.get("shard", "")}, separators=(",", ":"))
            for s in self.samples
        ]
        return ("\n".join(lines) + "\n").encode() if lines else b""


def parquet_schema() -> Any:
    """Return the schema of a tokenized shard's parquet file (pyarrow loaded on first use)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("input_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("length", pa.int32()),
            ("source", pa.string()),
            ("id", pa.string()),
            ("finish_reason", pa.string()),
            ("token_source", pa.string()),
            *((name, getattr(pa, kind)()) for name, kind in PROVENANCE_COLUMNS),
        ]
    )


def length_stats(lengths: Sequence[int]) -> dict[str, float | int]:
    """Return count, mean, p50, p90, p99 and max of ``lengths`` (nearest-rank percentiles)."""
    if not lengths:
        return {"count": 0, "mean": 0.0, "p50": 0, "p90": 0, "p99": 0, "max": 0}
    ordered = sorted(lengths)
    n = len(ordered)

    def pct(p: float) -> int:
        return ordered[max(0, math.ceil(p / 100 * n) - 1)]

    return {
        "count": n,
        "mean": round(sum(ordered) / n, 2),
        "p50": pct(50),
        "p90": pct(90),
        "p99": pct(99),
        "max": ordered[-1],
    }
