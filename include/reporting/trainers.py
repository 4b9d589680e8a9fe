"""Training on a run: the whole-run trainer export, its figures, and the card's instructions.

Every tokenized shard writes ``pretokenized/shard-NNNNN.jsonl`` (the parquet's rows as
``{"input_ids", "loss_mask", ...}`` JSON lines). The report joins them, in shard order, into
``pretokenized.jsonl`` at the root of the outputs once the whole dataset is published:
SpecForge's ``data.prompts_path`` takes one file, speculators' ``prepare_data --data`` a file
or a folder. The card then says, per trainer, what to paste (``training_lines``); the
trainer tier (tests/trainers/) runs exactly those snippets through the trainers' own loaders.

``export_figures`` and ``training_lines`` are pure; ``write_run_export`` is the one effect.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from include.layout import (
    CONVERSATIONS_GLOB,
    PRETOKENIZED_PREFIX,
    pretokenized_key,
    pretokenized_run_key,
    shard_index,
)
from include.storage import ObjectExistsError, Store

#: SpecForge's ``data.max_length`` default (``specforge/config/schema.py`` ``DataConfig``):
#: a longer pre-tokenized row is cut there without a word (``prompt_builder``).
SPECFORGE_DEFAULT_MAX_LENGTH = 2048
#: speculators' ``prepare-data --seq-length`` and ``train --total-seq-len`` defaults; longer
#: rows are cut as well.
SPECULATORS_DEFAULT_SEQ_LENGTH = 8192
#: The ``text_path`` counts of the tokenized manifests, summed by ``export_figures``.
TEXT_PATH_KEYS = ("rows", "end_of_turn_newline", "retokenized_text_differs", "without_system",
                  "with_dataset_turns", "dataset_turns")


def write_run_export(store: Store, shards: Sequence[str], *, publish: bool) -> dict[str, Any]:
    """Write ``pretokenized.jsonl``, the shards' exports joined in order, if ``publish``.

    Create-only and streamed (the store joins the objects in bounded memory); a retried
    report rebuilds the same bytes and succeeds. Returns where it is and what it holds, or
    why it was not written: the run did not publish the whole dataset, a shard has no export
    (tokenized by a version before the exports), or an earlier run's file differs.
    """
    key = pretokenized_run_key()
    out: dict[str, Any] = {"uri": store.uri(key), "folder_uri": store.uri(PRETOKENIZED_PREFIX),
                           "written": False}
    if not publish:
        out["reason"] = ("not written: the run did not publish the whole dataset (gates or "
                         "shards missing); the per-shard files in pretokenized/ are complete")
        return out
    sources = [pretokenized_key(shard_index(s)) for s in sorted(shards, key=shard_index)]
    try:
        # The store names a missing source itself, before it writes anything.
        size, digest = store.write_new_concat(key, sources)
    except FileNotFoundError as exc:
        out["reason"] = (f"not written: a shard has no trainer export ({exc}: tokenized "
                         "before the exports existed); tokenize it again in a new run")
        return out
    except ObjectExistsError:
        out["reason"] = "kept: an earlier run's file with other bytes is at this key"
        return out
    return {**out, "written": True, "bytes": size, "sha256": digest, "shards": len(sources)}


def export_figures(tokenized: Sequence[Mapping[str, Any] | None],
                   longest_row: int) -> dict[str, Any]:
    """Return the trainer-facing figures summed over the tokenized manifests.

    ``longest_row`` is the longest row in tokens (the trainers' ``max_length`` must be at
    least this, or they cut rows); ``text_path`` what re-tokenizing the conversations file
    would change; ``conversations_by_source`` whole and per-turn rows per source.
    """
    text = Counter()
    by_source: dict[str, Counter[str]] = {}
    for m in tokenized:
        if not m:
            continue
        text.update({k: int(v) for k, v in (m.get("text_path") or {}).items()})
        for src, counts in ((m.get("conversations") or {}).get("by_source") or {}).items():
            by_source.setdefault(src, Counter()).update(counts)
    return {"longest_row": longest_row,
            "text_path": {k: text.get(k, 0) for k in TEXT_PATH_KEYS},
            "conversations_by_source": {src: dict(sorted(c.items()))
                                        for src, c in sorted(by_source.items())}}


def specforge_data_block(longest_row: int) -> list[str]:
    """Return SpecForge's ``data:`` block for this run (YAML lines, as pasted)."""
    return ["data:", f"  prompts_path: ./{pretokenized_run_key()}",
            f"  max_length: {max(longest_row, 1)}"]


def speculators_command(model: str, longest_row: int) -> list[str]:
    """Return speculators' ``prepare-data`` and ``train`` command lines for this run."""
    n = max(longest_row, 1)
    packed = max(n, SPECULATORS_DEFAULT_SEQ_LENGTH)  # train packs rows to this and cuts longer
    return [f"speculators prepare-data --model {model} --data ./{PRETOKENIZED_PREFIX} \\",
            f"    --seq-length {n} --output ./prepared",
            f"speculators train --verifier-name-or-path {model} --data-path ./prepared \\",
            f"    --speculator-type eagle3 --total-seq-len {packed}"]


def training_lines(export: Mapping[str, Any], figures: Mapping[str, Any], model: str,
                   conversations: Mapping[str, Any] | None) -> list[str]:
    """Return the card's "Training on this run" section (Markdown lines)."""
    longest = int(figures.get("longest_row") or 0)
    tp = figures.get("text_path") or {}
    rows = int(tp.get("rows") or 0)
    cut_default = ("" if longest <= SPECFORGE_DEFAULT_MAX_LENGTH else
                   f" (SpecForge's default, {SPECFORGE_DEFAULT_MAX_LENGTH}, would cut the "
                   "longer rows without a word)")
    whole = (f"`{pretokenized_run_key()}` ({export.get('bytes', 0):,} bytes, sha256 "
             f"`{export.get('sha256')}`)" if export.get("written")
             else f"`{pretokenized_run_key()}`: {export.get('reason', 'not written')}")
    lines = [
        "## Training on this run", "",
        "Each row is the ids the target's server returned, as they are: train on the "
        "pre-tokenized files, not on the conversations, which a trainer tokenizes again with "
        f"its own template. Download the outputs first (paths below are relative to this "
        f"card's folder). The whole run: {whole}; per shard: `{PRETOKENIZED_PREFIX}/` (only "
        "those files: a folder a trainer may read whole). Fields: `input_ids`, `loss_mask` "
        "(1 on the ids the target sampled), `id`, `source`, `run_name`, `shard` (`id` joins "
        "the parquet's provenance columns).", "",
        f"**SpecForge** (online training, pre-tokenized): in your config, `max_length` is "
        f"this run's longest row, {longest:,} tokens{cut_default}:", "",
        "```yaml", *specforge_data_block(longest), "```", "",
        "**speculators** (pre-tokenized rows pass through `prepare-data` unchanged; "
        "`--seq-length` and `train`'s `--total-seq-len` at least the longest row, or it cuts "
        "them):", "",
        "```bash", *speculators_command(model, longest), "```", "",
        "`prepare-data` keeps `input_ids`, `loss_mask` and `seq_len` only (shuffled, seed 0): "
        "the `id` that joins a row to its provenance stays in these files. `train` holds out "
        "10% of the prepared rows for validation (`--train-data-ratio`, default 0.9).", "",
        "**NeMo Automodel** (EAGLE-3): its data path takes `messages`/`conversations` only, "
        "never token ids, and Qwen3's template has no `{% generation %}` markers, so it "
        "cannot mask multi-turn answers: it cannot train on these rows exactly. The closest "
        "path is SpecForge or speculators above; failing that, "
        f"`{CONVERSATIONS_GLOB}` with only the turns marked "
        "`\"generated\": true` in the loss.", "",
        "### What the text path would change in this run", "",
        f"Re-tokenizing `{CONVERSATIONS_GLOB}` (SpecForge's "
        f"`train_data_path`, speculators' render path, Automodel) would change every one of "
        f"the {rows:,} rows:", "",
        *_text_rows(tp),
        "Each message in that file says `\"generated\"`: true where the target wrote it in "
        "this run, false for the dataset's own turns. If you must use it, train only the "
        "target's turns (SpecForge `train_only_last_turn: true` for single-answer rows), "
        "give every conversation a system turn or use a template that adds none (SpecForge's "
        "`qwen`/`qwen3-thinking` add a default one), and expect the ids above to differ.", "",
    ]
    return lines + _conversation_rows(figures.get("conversations_by_source") or {},
                                      conversations)


def _text_rows(tp: Mapping[str, Any]) -> list[str]:
    return [
        f"- {int(tp.get('end_of_turn_newline') or 0):,} rows train a `\\n` after "
        "`<|im_end|>` that the server never sampled (the templates end a turn with "
        "`<|im_end|>\\n`);",
        f"- {int(tp.get('retokenized_text_differs') or 0):,} answers encode to other ids than "
        "the target sampled (`retokenized_text_differs`);",
        f"- {int(tp.get('without_system') or 0):,} rows have no system turn, so SpecForge's "
        "`qwen`/`qwen3-thinking` templates inject a default system prompt;",
        f"- {int(tp.get('with_dataset_turns') or 0):,} rows hold "
        f"{int(tp.get('dataset_turns') or 0):,} assistant turns the dataset wrote, not the "
        "target, which a trainer that trains every assistant turn puts in the loss.", "",
    ]


def _conversation_rows(by_source: Mapping[str, Mapping[str, int]],
                       conversations: Mapping[str, Any] | None) -> list[str]:
    if not by_source:
        return []
    table = ["| source | whole-conversation rows | per-turn rows |", "|---|---|---|",
             *(f"| {src} | {int(c.get('whole_rows', 0)):,} | {int(c.get('turn_rows', 0)):,} |"
               for src, c in by_source.items()), ""]
    apart = ", ".join(f"{r} {n:,}" for r, n in
                      ((conversations or {}).get("kept_apart") or {}).items() if n) or "-"
    return ["### Whole conversations in the exports", "",
            "A whole-conversation row carries the loss on every target turn; where a "
            "conversation is not prefix-stable (Qwen3 drops earlier turns' reasoning, so most "
            "thinking chats) each target turn is its own exact row "
            f"(`<conversation>#turn-<k>`), kept separate in every export ({apart}).", "",
            *table]
