"""The rehearsal's sources: a run's worth of prompts, a share of them whole conversations.

Two parquet files in the published schemas (``rows``): Infinity-Instruct chats (several user
turns in a fifth of them, regenerated with ``turns: all``) and WebInstructSub questions,
written a chunk at a time (654,676 prompts never sit in memory as dicts), with a margin of
rows over each source's quota (prepare filters some: languages, lengths), so that the quotas,
which sum to the asked number, are met exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from synthetic_sources import rows

#: Rows written per row a quota asks for (prepare drops Chinese rows and a few others).
MARGIN = 1.35
CHUNK = 20_000


def _write(path: Path, kind: str, n: int, seed: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(".partial")
    writer = None
    made = rows(kind, n, seed, dup_share=0.0)
    try:
        while True:
            chunk = [r for _, r in zip(range(CHUNK), made, strict=False)]
            if not chunk:
                break
            table = pa.Table.from_pylist(chunk)
            if writer is None:
                writer = pq.ParquetWriter(part, table.schema)
            writer.write_table(table.cast(writer.schema))
    finally:
        if writer is not None:
            writer.close()
    part.rename(path)  # a file at ``path`` is always whole


def rehearsal_sources(cache: Path, prompts: int, conversation_share: float = 0.3,
                      seed: int = 0) -> list[dict[str, Any]]:
    """Return the run's source settings (quotas summing to ``prompts``), writing their files
    under ``cache`` the first time only."""
    chats = round(prompts * conversation_share)
    folder = cache / f"rehearsal-{prompts}-{conversation_share}-{seed}"
    out = []
    for name, kind, quota, extra in (
            ("rehearsal_chats", "infinity_instruct", chats, {"turns": "all"}),
            ("rehearsal_questions", "webinstructsub", prompts - chats, {})):
        if quota <= 0:
            continue
        path = folder / f"{kind}.parquet"
        if not path.exists():
            _write(path, kind, int(quota * MARGIN) + 100, seed)
        out.append({"name": name, "kind": kind, "path": str(path), "quota": quota, **extra})
    return out
