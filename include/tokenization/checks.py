"""Sample checks: assembled texts in, samples (or quarantined records) out, every check on.

Nothing from the records is trusted. A sample is quarantined (kept out, counted, and listed
with its reason) when the prompt's token count differs from the server's
``usage.prompt_tokens``, the masked tokens do not decode back to the assistant text, the
prompt's tokens are not a prefix of the sample's tokens, thinking tags appear where the
template would not put them (``assembly``), or the mask would be all zeros or all ones.

Speed: prompts and assistant texts are encoded in two big batches with the fast tokenizer
(Rust threads). The sample's ids are prompt ids + assistant ids; that equals encoding the full
text whenever the junction is a pre-tokenization boundary (the template's special tokens make
it one for ChatML), which is proven per sample on a few characters around the junction, and a
sample whose junction cannot be proven cheaply is encoded whole and checked literally.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from include.tokenization.assembly import Pending, TokenizeOptions, assemble
from include.tokenization.chat import ChatTokenizer
from include.tokenization.outputs import Sample, TokenizeResult


def tokenize_completions(
    tokenizer: Any,
    records: Iterable[Mapping[str, Any]],
    options: TokenizeOptions | None = None,
) -> TokenizeResult:
    """Tokenize completion records (docs/data-layout.md) into samples, with every check on.

    ``tokenizer`` is a loaded fast tokenizer or a ``ChatTokenizer`` (reuse one across calls
    to pay its set-up once). Records that do not become samples are listed in the result's
    ``quarantined`` (a check failed) or ``dropped`` (a setting excluded them) with reasons.
    """
    options = options or TokenizeOptions()
    chat = tokenizer if isinstance(tokenizer, ChatTokenizer) else ChatTokenizer(tokenizer)
    result = TokenizeResult(
        settings={
            "include_reasoning": options.include_reasoning,
            "max_sequence_length": options.max_sequence_length,
            "over_length": options.over_length,
            "keep_truncated_completions": options.keep_truncated_completions,
            "tokenizer": str(getattr(chat.tokenizer, "name_or_path", "")),
        }
    )
    pending: list[Pending] = []
    for record in records:
        result.input_records += 1
        prepared = assemble(record, chat, options)
        if isinstance(prepared, tuple):
            kind, reason, detail = prepared
            entry = {"id": str(record.get("id", "")), "reason": reason, "detail": detail}
            (result.quarantined if kind == "quarantine" else result.dropped).append(entry)
        else:
            pending.append(prepared)
    if not pending:
        return result

    heads = [p.prompt + p.unmasked_extra for p in pending]
    head_ids = chat.encode(heads)
    tail_ids = chat.encode([p.assistant for p in pending])
    # The server counted the prompt alone; the unmasked extra (an empty think block) is
    # subtracted when it provably tokenizes on its own, else the prompt is encoded again.
    extras = sorted({p.unmasked_extra for p in pending if p.unmasked_extra})
    extra_ids = dict(zip(extras, chat.encode(extras), strict=True))
    prompt_len: dict[int, int] = {}
    recount: list[int] = []
    for i, p in enumerate(pending):
        ex = extra_ids.get(p.unmasked_extra, [])
        if not ex:
            prompt_len[i] = len(head_ids[i])
        elif head_ids[i][-len(ex) :] == ex and chat.junction_is_boundary(
            p.prompt, p.unmasked_extra
        ):
            prompt_len[i] = len(head_ids[i]) - len(ex)
        else:
            recount.append(i)
    for i, ids in zip(recount, chat.encode([pending[i].prompt for i in recount]), strict=True):
        prompt_len[i] = len(ids)
    unproven = [
        i for i, p in enumerate(pending) if not chat.junction_is_boundary(heads[i], p.assistant)
    ]
    full_ids = dict(
        zip(unproven, chat.encode([heads[i] + pending[i].assistant for i in unproven]), strict=True)
    )

    for i, p in enumerate(pending):
        head, tail = head_ids[i], tail_ids[i]

        def quarantine(reason: str, detail: str, p: Pending = p) -> None:
            result.quarantined.append({"id": p.id, "reason": reason, "detail": detail})

        if prompt_len[i] != p.prompt_tokens:
            quarantine(
                "prompt_tokens_mismatch",
                f"prompt renders to {prompt_len[i]} tokens, server counted {p.prompt_tokens}",
            )
            continue
        if i in full_ids:
            ids = full_ids[i]
            if ids[: len(head)] != head:
                quarantine(
                    "prompt_not_prefix",
                    "the prompt's tokens are not a prefix of the "
                    "sample's tokens (a token spans the prompt/completion boundary)",
                )
                continue
            tail = ids[len(head) :]
        else:
            ids = head + tail
        if not tail:
            quarantine("mask_all_zero", "no regenerated tokens")
            continue
        if not head:
            quarantine("mask_all_one", "no prompt tokens")
            continue
        if not chat.decodes_to(tail, p.assistant):
            quarantine("decode_mismatch", "masked tokens do not decode to the assistant text")
            continue
        mask = [0] * len(head) + [1] * len(tail)
        if len(ids) > options.max_sequence_length:
            if options.over_length == "drop" or len(head) >= options.max_sequence_length:
                result.dropped.append(
                    {
                        "id": p.id,
                        "reason": "over_length",
                        "detail": f"{len(ids)} > {options.max_sequence_length}",
                    }
                )
                continue
            ids = ids[: options.max_sequence_length]
            mask = mask[: options.max_sequence_length]
            result.truncated_to_max_length += 1
        result.samples.append(Sample(p.id, p.source, p.finish_reason, ids, mask, p.conversation))
    return result
