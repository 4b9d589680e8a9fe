"""Turn completion records into training-ready samples: token ids, a loss mask, and checks.

Each sample is the prompt exactly as the server rendered it (the chat template with the
generation prompt, ``enable_thinking`` as recorded in the completion's ``sampling``) followed
by the regenerated assistant turn, which is assembled with string operations in the template's
own layout: ``<think>\\nREASONING\\n</think>\\n\\nCONTENT<|im_end|>`` (Qwen3 thinking; without
reasoning the think block is empty and sits outside the loss). The loss mask is 1 exactly on the
regenerated tokens, and includes the closing ``<|im_end|>`` of a finished completion: the target
emitted that token, and a drafter that never proposes it cannot predict the end of a turn. The
template's trailing newline after ``<|im_end|>`` is not part of the sample (the server stops
at ``<|im_end|>``; nothing after it was generated). A completion cut by ``max_tokens`` (kept
only with ``keep_truncated_completions``) has no closing tags or ``<|im_end|>``: it is what the
model produced.

Nothing from the records is trusted. A sample is quarantined (kept out, counted, and listed
with its reason) when the prompt's token count differs from the server's
``usage.prompt_tokens``, the masked tokens do not decode back to the assistant text, the
prompt's tokens are not a prefix of the sample's tokens, thinking tags appear where the
template would not put them, or the mask would be all zeros or all ones.

Speed: prompts and assistant texts are encoded in two big batches with the fast tokenizer
(Rust threads). The sample's ids are prompt ids + assistant ids; that equals encoding the full
text whenever the junction is a pre-tokenization boundary (the template's special tokens make
it one for ChatML), which is proven per sample on a few characters around the junction, and a
sample whose junction cannot be proven cheaply is encoded whole and checked literally.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Literal

from include.tokenization.tokenizer import TokenizerError

log = logging.getLogger(__name__)

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
END_OF_TURN = "<|im_end|>"
EMPTY_THINK = "<think>\n\n</think>\n\n"

QUARANTINE_REASONS = (
    "invalid_record",
    "unexpected_finish_reason",
    "template_mismatch",
    "prompt_tokens_mismatch",
    "prompt_not_prefix",
    "decode_mismatch",
    "mask_all_zero",
    "mask_all_one",
)
DROP_REASONS = ("truncated_completion", "over_length")

# The right-hand window of the junction proof: past the completion's leading whitespace run
# (whose regex alternatives backtrack over the whole run) plus this many characters.
_JUNCTION_LOOKAHEAD = 16
_JUNCTION_MAX_SCAN = 256


@dataclass(frozen=True)
class TokenizeOptions:
    """The settings of the tokenization stage (names as in ``include/settings.py``).

    ``enable_thinking`` is used only for records without ``sampling.enable_thinking``.
    """

    include_reasoning: bool = True
    max_sequence_length: int = 32768
    over_length: Literal["drop", "truncate"] = "drop"
    keep_truncated_completions: bool = False
    enable_thinking: bool = True

    def __post_init__(self) -> None:
        if self.over_length not in ("drop", "truncate"):
            raise ValueError(f"over_length must be 'drop' or 'truncate', got {self.over_length!r}")
        if self.max_sequence_length < 1:
            raise ValueError(f"max_sequence_length must be >= 1, got {self.max_sequence_length}")

    @classmethod
    def from_settings(cls, settings: Any) -> TokenizeOptions:
        """Build options from a ``RunSettings`` (or any object with the same attributes)."""
        return cls(
            include_reasoning=settings.include_reasoning,
            max_sequence_length=settings.max_sequence_length,
            over_length=settings.over_length,
            keep_truncated_completions=settings.keep_truncated_completions,
            enable_thinking=settings.enable_thinking,
        )


@dataclass
class Sample:
    """One training sample; ``loss_mask[i]`` is 1 where ``input_ids[i]`` was regenerated."""

    id: str
    source: str
    finish_reason: str
    input_ids: list[int]
    loss_mask: list[int]
    conversation: list[dict[str, str]]

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
                "dropped": {r: dropped.get(r, 0) for r in DROP_REASONS},
                "truncated_to_max_length": self.truncated_to_max_length,
            },
            "tokens": {
                "total": sum(s.length for s in self.samples),
                "loss": sum(sum(s.loss_mask) for s in self.samples),
            },
            "length_stats": {src: length_stats(v) for src, v in sorted(by_source.items())},
            "quarantined": sorted(self.quarantined, key=lambda q: (q["id"], q["reason"])),
            "dropped": sorted(self.dropped, key=lambda d: (d["id"], d["reason"])),
            "settings": dict(self.settings),
        }

    def to_parquet(self) -> bytes:
        """Return the samples as one zstd parquet file (schema: ``PARQUET_SCHEMA``)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        samples = self.samples
        lengths = np.array([s.length for s in samples], dtype=np.int32)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths, dtype=np.int32)]))
        # Flatten through numpy: pyarrow's own conversion of long Python int lists is slow.
        ids = np.array(list(chain.from_iterable(s.input_ids for s in samples)), dtype=np.int32)
        mask = np.array(list(chain.from_iterable(s.loss_mask for s in samples)), dtype=np.int8)
        table = pa.Table.from_arrays(
            [
                pa.ListArray.from_arrays(offsets, pa.array(ids)),
                pa.ListArray.from_arrays(offsets, pa.array(mask)),
                pa.array(lengths),
                pa.array([s.source for s in samples], pa.string()),
                pa.array([s.id for s in samples], pa.string()),
                pa.array([s.finish_reason for s in samples], pa.string()),
            ],
            schema=_parquet_schema(),
        )
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        return buf.getvalue()

    def conversations_jsonl(self) -> bytes:
        """Return SpecForge-style lines ``{"id", "conversations": [{"role", "content"}]}``."""
        lines = [
            json.dumps(
                {"id": s.id, "conversations": s.conversation}, ensure_ascii=False, sort_keys=True
            )
            for s in self.samples
        ]
        return ("\n".join(lines) + "\n").encode() if lines else b""


def _parquet_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("input_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("length", pa.int32()),
            ("source", pa.string()),
            ("id", pa.string()),
            ("finish_reason", pa.string()),
        ]
    )


def __getattr__(name: str) -> Any:
    # PARQUET_SCHEMA is built on first use so that importing this module does not load pyarrow.
    if name == "PARQUET_SCHEMA":
        return _parquet_schema()
    raise AttributeError(name)


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


# --------------------------------------------------------------------------------------------
class ChatTokenizer:
    """The target tokenizer plus what this stage derives from it once (checks and tables).

    Building one checks that the chat template renders a final assistant turn the way the
    stage assembles it (``<think>\\nR\\n</think>\\n\\nC<|im_end|>``); raises TokenizerError if not.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        if self.backend is None:
            raise TokenizerError("the tokenization stage needs a fast (Rust) tokenizer")
        vocab = self.backend.get_vocab(with_added_tokens=True)
        if END_OF_TURN not in vocab:
            raise TokenizerError(f"the tokenizer has no {END_OF_TURN} token; expected ChatML")
        added = [t.content for t in self.backend.get_added_tokens_decoder().values()]
        self.added_tokens = tuple(sorted(set(added), key=len, reverse=True))
        self._max_added = max((len(t) for t in self.added_tokens), default=0)
        self._byte_table = _byte_table(self.backend, vocab, set(added))
        self._check_template()

    def render_prompt(self, messages: list[dict[str, Any]], enable_thinking: bool) -> str:
        """Return the prompt exactly as the server renders it (generation prompt appended)."""
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
        )

    def _check_template(self) -> None:
        messages = [{"role": "user", "content": "U"}]
        prompt = self.render_prompt(messages, True)
        full = self.tokenizer.apply_chat_template(
            [*messages, {"role": "assistant", "content": "C", "reasoning_content": "R"}],
            tokenize=False,
        )
        opener = "" if prompt.endswith(THINK_OPEN + "\n") else THINK_OPEN + "\n"
        expected = prompt + opener + "R\n" + THINK_CLOSE + "\n\nC" + END_OF_TURN
        if full.rstrip("\n") != expected:
            raise TokenizerError(
                "the chat template renders an assistant turn differently from the layout this "
                f"stage assembles: template {full[len(prompt) - 30 :]!r}, stage "
                f"{expected[len(prompt) - 30 :]!r}. Use the model's own ChatML-with-thinking "
                "template (Qwen3 family)."
            )

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Return token ids of ``texts`` (no added BOS/EOS), batched on Rust threads."""
        if not texts:
            return []
        return [e.ids for e in self.backend.encode_batch_fast(texts, add_special_tokens=False)]

    def decodes_to(self, ids: Sequence[int], text: str) -> bool:
        """Return whether ``ids`` decode to exactly ``text`` (byte-level table, no cleanup)."""
        if self._byte_table is None:
            return self.backend.decode(list(ids), skip_special_tokens=False) == text
        table = self._byte_table
        try:
            return b"".join([table[i] for i in ids]) == text.encode("utf-8")
        except IndexError:
            return False

    def junction_is_boundary(self, prefix: str, suffix: str) -> bool:
        """Return True if encode(prefix + suffix) == encode(prefix) + encode(suffix) is proven.

        Proof: no added token spans the junction, and the pre-tokenizer, run from the last
        added token of ``prefix`` to a little past the start of ``suffix``, splits at the
        junction. False means "not proven" (the caller checks the full encoding instead).
        """
        if not suffix or not prefix:
            return True
        if self.backend.normalizer is not None:
            return False  # normalization can merge characters across the junction
        k = self._max_added
        around = prefix[-k:] + suffix[:k]
        cut = len(prefix[-k:])
        for tok in self.added_tokens:
            start = around.find(tok)
            while start != -1:
                if start < cut < start + len(tok):
                    return False
                start = around.find(tok, start + 1)
        if any(suffix.startswith(t) for t in self.added_tokens) or any(
            prefix.endswith(t) for t in self.added_tokens
        ):
            return True
        window = prefix[-_JUNCTION_MAX_SCAN:]
        tail_start = -1
        for tok in self.added_tokens:
            pos = window.rfind(tok)
            if pos != -1:
                tail_start = max(tail_start, pos + len(tok))
        if tail_start < 0:
            return False  # no segment start nearby to run the pre-tokenizer from
        left = window[tail_start:]
        lead = len(suffix) - len(suffix.lstrip())
        if lead > _JUNCTION_MAX_SCAN:
            return False
        right = suffix[: lead + _JUNCTION_LOOKAHEAD]
        for tok in self.added_tokens:  # stop the window at the suffix's first added token
            pos = right.find(tok)
            if pos != -1:
                right = right[:pos]
        pieces = self.backend.pre_tokenizer.pre_tokenize_str(left + right)
        return any(start == len(left) for _, (start, _) in pieces)


def _byte_table(backend: Any, vocab: Mapping[str, int], added: set[str]) -> list[bytes] | None:
    """Return id -> bytes for a byte-level BPE (decode = concatenation), else None."""
    from tokenizers import decoders

    if not isinstance(backend.decoder, decoders.ByteLevel):
        return None
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    char_to_byte = {chr(c): b for b, c in zip(printable, codes, strict=True)}
    table = [b""] * (max(vocab.values()) + 1)
    for text, idx in vocab.items():
        if text in added:
            table[idx] = text.encode("utf-8")
        else:
            try:
                table[idx] = bytes(char_to_byte[c] for c in text)
            except KeyError:
                return None  # not a GPT-2 byte-level vocabulary after all
    return table


# --------------------------------------------------------------------------------------------
@dataclass
class _Pending:
    record: Mapping[str, Any]
    id: str
    source: str
    finish_reason: str
    prompt: str
    unmasked_extra: str  # generated-by-template text after the prompt, outside the loss
    assistant: str  # the regenerated text: masked
    conversation: list[dict[str, str]]
    prompt_tokens: int


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _prepare(
    record: Mapping[str, Any], chat: ChatTokenizer, options: TokenizeOptions
) -> _Pending | tuple[str, str, str]:
    """Return the texts of one record, or ``(kind, reason, detail)`` when it goes nowhere."""
    finish = record.get("finish_reason")
    messages = record.get("messages")
    usage = record.get("usage") or {}
    if (
        not isinstance(messages, list)
        or not messages
        or not isinstance(usage.get("prompt_tokens"), int)
    ):
        return ("quarantine", "invalid_record", "needs messages and usage.prompt_tokens")
    if finish not in ("stop", "length"):
        return ("quarantine", "unexpected_finish_reason", f"finish_reason={finish!r}")
    if finish == "length" and not options.keep_truncated_completions:
        return ("drop", "truncated_completion", "finish_reason=length")
    content = _text(record.get("content"))
    reasoning = _text(record.get("reasoning_content"))
    sampling = record.get("sampling") or {}
    thinking = sampling.get("enable_thinking", options.enable_thinking) is not False
    for name, text in (("content", content), ("reasoning_content", reasoning)):
        if THINK_OPEN in text or THINK_CLOSE in text:
            return (
                "quarantine",
                "template_mismatch",
                f"{name} contains thinking tags (reasoning not split by the server?)",
            )
    if not thinking and reasoning.strip():
        return (
            "quarantine",
            "template_mismatch",
            "reasoning_content present although enable_thinking=false",
        )
    try:
        prompt = chat.render_prompt(messages, thinking)
    except Exception as exc:  # jinja raises many types for malformed messages
        return ("quarantine", "invalid_record", f"chat template failed: {exc}")
    finished = finish == "stop"
    end = END_OF_TURN if finished else ""
    extra = ""
    if not thinking:
        # The template already put the empty think block into the prompt.
        assistant, shown = content + end, content
    else:
        # Templates that open the think block in the generation prompt leave the model to
        # write only what follows "<think>\n".
        opener = "" if prompt.endswith(THINK_OPEN + "\n") else THINK_OPEN + "\n"
        if not finished and not content:  # cut inside the reasoning: no closing tag exists
            body = reasoning
        else:
            body = reasoning.strip("\n") + "\n" + THINK_CLOSE + "\n\n"
        if options.include_reasoning:
            assistant = opener + body + content + end
            shown = THINK_OPEN + "\n" + body + content
        elif not finished and not content:
            assistant, shown = "", ""  # nothing but reasoning was generated
        else:
            # Not generated as such: the empty think block the template renders sits outside
            # the loss; only the answer is trained on.
            extra = EMPTY_THINK[len(THINK_OPEN + "\n") - len(opener) :]
            assistant, shown = content + end, content
    conversation = [
        {"role": str(m.get("role", "")), "content": _text(m.get("content"))} for m in messages
    ]
    conversation.append({"role": "assistant", "content": shown})
    return _Pending(
        record,
        str(record.get("id", "")),
        str(record.get("source", "")),
        finish,
        prompt,
        extra,
        assistant,
        conversation,
        usage["prompt_tokens"],
    )


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
    pending: list[_Pending] = []
    for record in records:
        result.input_records += 1
        prepared = _prepare(record, chat, options)
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

        def quarantine(reason: str, detail: str, p: _Pending = p) -> None:
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


def tokenized_keys(shard_index: int) -> tuple[str, str, str]:
    """Return the parquet, conversations and manifest keys of a tokenized shard."""
    name = f"tokenized/shard-{shard_index:05d}"
    return f"{name}.parquet", f"{name}.conversations.jsonl", f"{name}.manifest.json"


def tokenize_shard(
    store: Any,
    shard_index: int,
    tokenizer: Any,
    options: TokenizeOptions | None = None,
) -> dict[str, Any]:
    """Tokenize ``generated/shard-NNNNN.jsonl`` and publish ``tokenized/shard-NNNNN.*``.

    Create-only through ``include.storage.publish_files``: a retry with the same inputs and
    settings rewrites nothing; the manifest (returned) is written last. Raises ValueError if
    a line of the input is not JSON.
    """
    from include.storage.publish import publish_files

    source_key = f"generated/shard-{shard_index:05d}.jsonl"
    records = []
    for lineno, line in enumerate(store.read(source_key).splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError as exc:
                where = f"{store.uri(source_key)} line {lineno}"
                raise ValueError(f"{where}: not JSON ({exc})") from None
    result = tokenize_completions(tokenizer, records, options)
    parquet_key, conv_key, manifest_key = tokenized_keys(shard_index)
    manifest = {"shard": shard_index, "source": source_key, **result.manifest()}
    published = publish_files(
        store,
        {parquet_key: result.to_parquet(), conv_key: result.conversations_jsonl()},
        manifest_key,
        manifest,
    )
    return published.manifest


@functools.lru_cache(maxsize=2)
def _chat_tokenizer(path: str) -> ChatTokenizer:
    from include.tokenization.tokenizer import load_tokenizer

    return ChatTokenizer(load_tokenizer(path))


def tokenize_run_shard(settings: Any, shard_id: str, store: Any) -> dict[str, Any]:
    """Tokenize one shard of a run with the run's tokenizer and settings; return its manifest."""
    from include.prompts.prepare import shard_index

    tokenizer = _chat_tokenizer(settings.tokenizer_path or settings.model_path)
    manifest = tokenize_shard(store, shard_index(shard_id), tokenizer,
                              TokenizeOptions.from_settings(settings))
    log.info("%s: tokenized %s", shard_id, json.dumps(manifest["counts"]))
    return manifest
