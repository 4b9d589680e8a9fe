"""Sample checks: a record's parts in, a sample (or a record kept out, with its reason) out.

Every check compares against the server's own data, never against a rebuild of ours:

- server ids (``token_source: server``): the ids are as many as the server's usage counts
  (``assembly``); the sample's prompt ids equal the server's prompt ids; its masked ids equal
  the ids the server sampled; those ids, less the matched stop token, decode to exactly the
  text the server returned;
- raw text (``token_source: text``, servers that return no ids): the prompt as rendered here
  has as many tokens as the server counted, and the text re-encodes to as many tokens as the
  server sampled (``retokenized_count_mismatch`` otherwise: those cannot be its ids).

Two figures are counted, not enforced: ``retokenized_text_differs`` (server rows whose text,
encoded again, differs from the ids the model sampled: what a text-only pipeline would have
trained on instead) and ``prompt_render_differs`` (server rows whose prompt this worker's
tokenizer and template render to other ids: token budgets computed here were off).

Speed: every text is encoded in one batch with the fast tokenizer (Rust threads), while the
quality filters and the decode checks run (``tokenize_completions``).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from itertools import compress
from typing import Any, NamedTuple

from include.quality import QualityOptions, filter_records
from include.tokenization.assembly import Pending, TokenizeOptions, assemble
from include.tokenization.chat import ChatTokenizer
from include.tokenization.conversations import explode, merge
from include.tokenization.outputs import Sample, TokenizeResult
from include.tokenization.provenance import provenance

#: Records per encoded batch: enough for the Rust threads to share, small enough that the
#: first batch starts early.
_CHUNK = 64


class Built(NamedTuple):
    """A sample before its checks: ids, mask, and what it must start with and train on."""

    ids: list[int]
    mask: list[int]
    prompt: list[int]
    trained: list[int]


def tokenize_completions(
    tokenizer: Any,
    records: Iterable[Mapping[str, Any]],
    options: TokenizeOptions | None = None,
) -> TokenizeResult:
    """Tokenize completion records (docs/data-layout.md) into samples, with every check on.

    ``tokenizer`` is a loaded fast tokenizer or a ``ChatTokenizer`` (reuse one across calls
    to pay its set-up once). Records that do not become samples are listed in the result's
    ``quarantined`` (an output quality filter or a check failed) or ``dropped`` (a setting
    excluded them) with reasons. The quality filters run first, on the records as generated.
    """
    options = options or TokenizeOptions()
    chat = tokenizer if isinstance(tokenizer, ChatTokenizer) else ChatTokenizer(tokenizer)
    with _no_cycle_collection():
        return _tokenize(chat, records, options)


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Pause the cyclic garbage collector: the stage makes no cycles (refcounting frees all
    it drops), but every young-generation pass walks each new list of ids item by item, 5%
    of the stage's time (bench_tokenize)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def _tokenize(
    chat: ChatTokenizer, records: Iterable[Mapping[str, Any]], options: TokenizeOptions
) -> TokenizeResult:
    result = TokenizeResult(
        settings={
            "include_reasoning": options.include_reasoning,
            "max_sequence_length": options.max_sequence_length,
            "over_length": options.over_length,
            "keep_truncated_completions": options.keep_truncated_completions,
            "tokenizer": str(getattr(chat.tokenizer, "name_or_path", "")),
            "quality_filters_off": sorted(options.quality_filters_off),
        }
    )
    records = list(records)
    result.input_records = len(records)
    # A whole conversation is checked turn by turn, as the single-turn records it was sent as.
    records, conversations = explode(records)
    # The records' texts are encoded on Rust threads that release the GIL, a batch per chunk
    # of records as soon as it is assembled, while the next chunk is assembled, the quality
    # filters and the decode checks run, and the samples of the chunks already encoded are
    # built: on two cores the Python work costs half its time. A record the filters
    # quarantine keeps their reason, as if it had never been assembled (its encoding wasted).
    assembled: dict[int, Pending | tuple[str, str, str]] = {}
    with ThreadPoolExecutor(max_workers=1) as pool:
        encodings = []
        for start in range(0, len(records), _CHUNK):
            part = {id(r): assemble(r, chat, options) for r in records[start: start + _CHUNK]}
            assembled.update(part)
            ready = [p for p in part.values() if isinstance(p, Pending)]
            encodings.append(pool.submit(_encode_all, chat, ready))
        kept, filtered = filter_records(records, QualityOptions(
            off=options.quality_filters_off,
            enable_thinking=options.enable_thinking,
            # Cut completions are judged only when they will be trained on; otherwise the
            # ``truncated_completion`` drop already keeps them out, counted as such.
            check_truncated=options.keep_truncated_completions,
        ))
        result.quarantined.extend(filtered)
        pending: list[Pending] = []
        for record in kept:
            prepared = assembled[id(record)]
            if isinstance(prepared, tuple):
                kind, reason, detail = prepared
                entry = {"id": str(record.get("id", "")), "reason": reason, "detail": detail}
                (result.quarantined if kind == "quarantine" else result.dropped).append(entry)
            else:
                pending.append(prepared)
        decoded = {id(p): _server_ids_decode(p, chat) for p in pending
                   if p.sampled_ids is not None}
        encoded: dict[int, tuple[list[int], list[int], list[int]]] = {}
        batches = iter(encodings)  # in record order, as ``pending`` is
        for p in pending:
            while id(p) not in encoded:
                encoded.update(next(batches).result())
            local_prompt, text_ids, extra = encoded.pop(id(p))
            built = _build(p, chat, local_prompt, text_ids, extra, decoded.get(id(p)), result)
            problem = built if not isinstance(built, Built) else verify(*built)
            if problem:
                result.quarantined.append(
                    {"id": p.id, "reason": problem[0], "detail": problem[1]})
                continue
            assert isinstance(built, Built)
            _keep(p, built.ids, built.mask, options, result)
    if not pending:
        result.conversations = conversations.manifest() if conversations.turns else {}
        return result
    merge(result, conversations, whole_rows=options.include_reasoning)
    result.conversations = conversations.manifest() if conversations.turns else {}
    return result


def _encode_all(
    chat: ChatTokenizer, ready: list[Pending]
) -> dict[int, tuple[list[int], list[int], list[int]]]:
    """Return ``{id(p): (prompt ids, trained-text ids, extra ids)}``, encoded in one batch."""
    if not ready:
        return {}
    extras = sorted({p.unmasked_extra for p in ready if p.unmasked_extra})
    n = len(ready)
    ids = chat.encode([p.prompt for p in ready] + [p.trained_text for p in ready] + extras)
    extra_ids = dict(zip(extras, ids[2 * n:], strict=True))
    return {id(p): (ids[i], ids[n + i], extra_ids.get(p.unmasked_extra, []))
            for i, p in enumerate(ready)}


def _server_ids_decode(p: Pending, chat: ChatTokenizer) -> bool:
    """Return whether the server's sampled ids, less the stop token, decode to its text."""
    assert p.sampled_ids is not None
    return chat.decodes_to(_text_ids(p), p.trained_text)


def _text_ids(p: Pending) -> list[int]:
    """The server's sampled ids of ``p`` that its text spells (all but the stop token)."""
    trained = p.sampled_ids or []
    return trained[:-1] if p.stop_id is not None and trained else trained


def _build(
    p: Pending, chat: ChatTokenizer, local_prompt: list[int], encoded: list[int],
    extra: list[int], decodes: bool | None, result: TokenizeResult,
) -> Built | tuple[str, str]:
    """Return the sample, or ``(reason, detail)`` when a check against the server fails.

    ``decodes``: whether the server's ids decode to its text (``_server_ids_decode``); None
    on the text path.
    """
    if p.sampled_ids is not None:
        assert p.prompt_ids is not None
        prompt, trained = p.prompt_ids, p.sampled_ids
        if local_prompt != prompt:
            result.prompt_render_differs += 1
        if encoded != _text_ids(p):
            result.retokenized_text_differs += 1
        if decodes is not True:
            return ("decode_mismatch",
                    "the sampled ids do not decode to the text the server returned")
    else:
        if len(local_prompt) != p.prompt_tokens:
            return ("prompt_tokens_mismatch",
                    f"prompt renders to {len(local_prompt)} tokens, server counted "
                    f"{p.prompt_tokens}")
        prompt = local_prompt
        trained = encoded + ([p.stop_id] if p.stop_id is not None else [])
        whole = p.trained_text == p.text
        if whole and p.completion_tokens is not None and len(trained) != p.completion_tokens:
            return ("retokenized_count_mismatch",
                    f"the text encodes to {len(trained)} tokens, the server sampled "
                    f"{p.completion_tokens}: these are not the ids the model generated")
        if not chat.decodes_to(encoded, p.trained_text):
            return ("decode_mismatch", "the encoded text does not decode back to the text")
    closing = []
    if p.finish_reason == "stop" and p.stop_id is None:
        # The server's ids stop before the turn's end: the template closes it, untrained.
        closing = [chat.end_of_turn_id]
        result.closed_by_template += 1
    if not trained:
        return ("mask_all_zero", "no regenerated tokens")
    if not prompt:
        return ("mask_all_one", "no prompt tokens")
    ids = prompt + extra + trained + closing
    mask = [0] * (len(prompt) + len(extra)) + [1] * len(trained) + [0] * len(closing)
    return Built(ids, mask, prompt, trained)


def verify(
    ids: list[int], mask: list[int], prompt: list[int], trained: list[int]
) -> tuple[str, str] | None:
    """Return the failed check of a built sample, or None: read back from ids and mask alone.

    The sample must start with ``prompt`` (the server's prompt ids, or the prompt rendered
    here when the server returned none) and its masked ids must be ``trained`` exactly.
    """
    if len(ids) != len(mask):
        return ("masked_ids_mismatch", "input_ids and loss_mask differ in length")
    if ids[: len(prompt)] != prompt or any(mask[: len(prompt)]):
        return ("prompt_ids_mismatch", "the sample does not start with the prompt's ids")
    if list(compress(ids, mask)) != trained:
        return ("masked_ids_mismatch", "the masked ids are not the sampled ids")
    return None


def _keep(
    p: Pending, ids: list[int], mask: list[int], options: TokenizeOptions,
    result: TokenizeResult,
) -> None:
    if len(ids) > options.max_sequence_length:
        head = mask.index(1)
        if options.over_length == "drop" or head >= options.max_sequence_length:
            result.dropped.append({"id": p.id, "reason": "over_length",
                                   "detail": f"{len(ids)} > {options.max_sequence_length}"})
            return
        ids = ids[: options.max_sequence_length]
        mask = mask[: options.max_sequence_length]
        result.truncated_to_max_length += 1
    result.token_source[p.token_source] += 1
    result.samples.append(Sample(p.id, p.source, p.finish_reason, ids, mask, p.conversation,
                                 p.token_source, provenance(p.record)))
