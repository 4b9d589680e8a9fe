"""The funnel: what happened to every row read, per source, and the manifest that holds it.

Every row read ends in exactly one place: a prompt in one shard, or a count under one drop
reason (``read == kept + sum(drops)`` per source, checked before anything is written).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from include.prompts.control import ControlTokens
from include.prompts.encoding import printable_id
from include.prompts.errors import PrepareError
from include.settings import PREPARATION_SETTINGS, RunSettings

#: Every reason a row can be dropped for, in the order they are checked.
PREPARE_DROP_REASONS = (
    "malformed",
    "unknown_role",
    "no_user_turn",
    "empty",
    "control_token",
    "filtered_language",
    "filtered_source",
    "too_short",
    "too_long",
    "already_in_existing_set",
    "duplicate_within_source",
    "duplicate_across_sources",
    "over_quota",
    "held_out",  # not dropped: kept out of training for the held-out split (eval/)
)
SAMPLE_IDS_PER_REASON = 5


@dataclass
class SourceFunnel:
    """What happened to one source's rows."""

    name: str
    kind: str = ""
    read: int = 0
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    samples: dict[str, list[str]] = field(default_factory=dict)

    def drop(self, reason: str, row_id: str, detail: str = "") -> None:
        self.dropped[reason] += 1
        bucket = self.samples.setdefault(reason, [])
        if len(bucket) < SAMPLE_IDS_PER_REASON:
            # A row id may hold a lone surrogate (hostile data): the manifest must stay text.
            sample = f"{row_id} ({detail})" if detail else row_id
            bucket.append(printable_id(sample))

    def check(self) -> None:
        total = self.kept + sum(self.dropped.values())
        if total != self.read:
            raise PrepareError(
                f"source {self.name!r}: funnel does not add up (read {self.read}, kept "
                f"{self.kept}, dropped {sum(self.dropped.values())}); this is a bug, nothing "
                "was written"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "read": self.read,
            "kept": self.kept,
            "dropped": {r: self.dropped[r] for r in PREPARE_DROP_REASONS if self.dropped[r]},
            "drop_samples": {r: self.samples[r] for r in PREPARE_DROP_REASONS if r in self.samples},
        }


def build_manifest(
    settings: RunSettings,
    length_unit: str,
    funnels: list[SourceFunnel],
    shards: list[dict[str, Any]],
    control: ControlTokens | str | None = None,
    held_out: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the prepare stage's manifest: its settings, the funnel and the shard list.

    ``control``: the control-token rule applied, or why none could be (a string);
    ``held_out``: the held-out split's summary (``held_out.write_held_out``).
    """
    return {
        "stage": "prepare",
        "preparation_fingerprint": settings.fingerprint(PREPARATION_SETTINGS),
        "preparation_settings": settings.subset(PREPARATION_SETTINGS),
        "length_unit": length_unit,
        "drop_reasons": list(PREPARE_DROP_REASONS),
        "control_tokens": (control.to_manifest() if isinstance(control, ControlTokens)
                           else {"unchecked": control or "no tokenizer"}),
        "sources": {f.name: f.to_dict() for f in funnels},
        "totals": {
            "read": sum(f.read for f in funnels),
            "kept": sum(f.kept for f in funnels),
            "dropped": sum(sum(f.dropped.values()) for f in funnels),
            "held_out": sum(f.dropped["held_out"] for f in funnels),
        },
        "held_out": held_out or {"count": 0},
        "shard_size": settings.shard_size,
        "shards": shards,
    }


#: Widest line of the funnel table (a task log viewed at 120 columns).
FUNNEL_WIDTH = 120


def format_funnel(manifest: dict[str, Any]) -> str:
    """Return the manifest's funnel as a fixed-width table (one row per source)."""
    sources = manifest["sources"].values()
    reasons = [r for r in PREPARE_DROP_REASONS if any(s["dropped"].get(r) for s in sources)]
    header = ["source", "read", "kept", *reasons]
    rows = [
        [name, str(s["read"]), str(s["kept"]), *(str(s["dropped"].get(r, 0)) for r in reasons)]
        for name, s in manifest["sources"].items()
    ]
    t = manifest["totals"]
    rows.append(
        [
            "TOTAL",
            str(t["read"]),
            str(t["kept"]),
            *(
                str(sum(s["dropped"].get(r, 0) for s in manifest["sources"].values()))
                for r in reasons
            ),
        ]
    )
    # Headers on two lines, split at the underscore nearest their middle, and the columns in
    # blocks (each repeating the source) so that every line fits a 120-column log view.
    heads = [_split_header(h) for h in header]
    lines = [[h[0] for h in heads], [h[1] for h in heads], *rows]
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
    blocks: list[list[int]] = [[]]
    used = widths[0]
    for i in range(1, len(header)):
        if blocks[-1] and used + 2 + widths[i] > FUNNEL_WIDTH:
            blocks.append([])
            used = widths[0]
        blocks[-1].append(i)
        used += 2 + widths[i]
    return "\n\n".join(
        "\n".join(
            "  ".join([r[0].ljust(widths[0]), *(r[i].rjust(widths[i]) for i in block)]).rstrip()
            for r in lines
        )
        for block in blocks
    )


def _split_header(name: str) -> tuple[str, str]:
    cuts = [i for i, ch in enumerate(name) if ch == "_"]
    if not cuts:
        return "", name
    cut = min(cuts, key=lambda i: abs(2 * i - len(name)))
    return name[: cut + 1], name[cut + 1 :]
