"""Per-row provenance: where each sample came from, read off its completion record.

Every sample carries the sampling parameters the engine actually sent (the record's
``sampling``), the server's usage counts (``cached_tokens`` from
``usage.prompt_tokens_details``, SGLang's ``--enable-cache-report``; None when not
reported), the model and server as recorded, the server's version (``server_version``, None
when the record has none) and the run and shard that made it.

In the parquet these are flat, typed, nullable scalar columns (``PROVENANCE_COLUMNS``), plus
the whole ``sampling`` mapping as a canonical JSON string: flat columns load through
``datasets`` and filter (``ds.filter(lambda r: r["sampling_temperature"] == 0.6)``) without a
struct whose fields could differ between shards and break concatenating them, and the JSON
string keeps any sampling key added later. The conversations JSONL carries the same values
under one ``provenance`` object.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: Column name -> pyarrow type factory name, in parquet order.
PROVENANCE_COLUMNS = (
    ("run_name", "string"),
    ("shard", "string"),
    ("model", "string"),
    ("server", "string"),
    ("server_version", "string"),
    # The weights that answered (SGLang's ``metadata.weight_version``), None if not reported.
    ("weight_version", "string"),
    ("prompt_tokens", "int32"),
    ("completion_tokens", "int32"),
    ("cached_tokens", "int32"),
    ("sampling_temperature", "float64"),
    ("sampling_top_p", "float64"),
    ("sampling_top_k", "int32"),
    ("sampling_max_tokens", "int32"),
    ("sampling_enable_thinking", "bool_"),
    # The row's mixed-sampling variant (setting ``sampling_variants``), e.g.
    # ``temperature=1.0,enable_thinking=false``; None when the run had one sampling.
    ("sampling_variant", "string"),
    ("sampling", "string"),
)


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def _float(value: Any) -> float | None:
    return float(value) if type(value) in (int, float) else None


def _str(value: Any) -> str | None:
    return str(value) if value is not None else None


def provenance(record: Mapping[str, Any]) -> dict[str, Any]:
    """Return a sample's provenance columns from its record; every value may be None.

    ``run_name`` and ``shard`` are not in a record: the result's ``origin`` fills them in.

    Read defensively: a record from an older engine (or a server without cache reports)
    lacks some fields, and a wrong type is recorded as None rather than guessed at.
    """
    usage = record.get("usage")
    usage = usage if isinstance(usage, Mapping) else {}
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, Mapping) else {}
    sampling = record.get("sampling")
    sampling = sampling if isinstance(sampling, Mapping) else {}
    thinking = sampling.get("enable_thinking")
    return {
        "run_name": None,
        "shard": None,
        "model": _str(record.get("model")),
        "server": _str(record.get("server")),
        "server_version": _str(record.get("server_version")),
        "weight_version": _str(record.get("weight_version")),
        "prompt_tokens": _int(usage.get("prompt_tokens")),
        "completion_tokens": _int(usage.get("completion_tokens")),
        "cached_tokens": _int(details.get("cached_tokens")),
        "sampling_temperature": _float(sampling.get("temperature")),
        "sampling_top_p": _float(sampling.get("top_p")),
        "sampling_top_k": _int(sampling.get("top_k")),
        "sampling_max_tokens": _int(sampling.get("max_tokens")),
        "sampling_enable_thinking": thinking if isinstance(thinking, bool) else None,
        "sampling_variant": _str(sampling.get("variant")),
        "sampling": json.dumps(dict(sampling), sort_keys=True, separators=(",", ":"),
                               default=str),
    }


def provenance_object(row: Mapping[str, Any]) -> dict[str, Any]:
    """Return the provenance for the conversations JSONL: the columns, ``sampling`` parsed."""
    return {**row, "sampling": json.loads(row["sampling"]) if row.get("sampling") else {}}
