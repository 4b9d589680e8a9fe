"""The prepare funnel table fits a 120-column log view with every drop reason present."""

from __future__ import annotations

from include.prompts.funnel import PREPARE_DROP_REASONS, format_funnel


def test_funnel_with_every_reason_fits_120_columns_and_keeps_every_number() -> None:
    sources = {f"source_{i}_with_a_long_name": {
        "read": 1_000_000, "kept": 900_000,
        "dropped": {r: 10_000 + n for n, r in enumerate(PREPARE_DROP_REASONS)}} for i in range(2)}
    manifest = {"sources": sources, "totals": {"read": 2_000_000, "kept": 1_800_000}}
    table = format_funnel(manifest)
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= 120, table
    # Blocks of columns, each: two header lines, the sources, TOTAL; every number once.
    blocks = table.split("\n\n")
    assert len(blocks) > 1
    total = []
    for block in blocks:
        rows = block.splitlines()
        assert len(rows) == 2 + len(sources) + 1
        assert rows[-1].startswith("TOTAL")
        total += rows[-1].split()[1:]
    assert total == ["2000000", "1800000",
                     *(str(2 * (10_000 + n)) for n in range(len(PREPARE_DROP_REASONS)))]
