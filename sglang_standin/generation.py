"""Write deterministic completions as real token ids of the served tokenizer.

A completion is a pure function of (server seed, prompt text, sampling params other than the
length cap): a hash seeds an RNG that draws a long-tailed natural length, then words from the
bundled list. `max_tokens` only cuts, so a capped completion is a prefix of the uncapped one.

Units are chosen so that each is whole pre-tokens under Qwen's split pattern (" word",
"," + " word", "." + " Word", ".\\n\\n" + "Word"), hence encode(decode(ids)) == ids and
completion_tokens is the count the tokenizer itself would give the text. A real model may
sample a word as a non-canonical split (" hel" + "lo" where the tokenizer says " hello"): the
same text, other ids. `noncanonical_rate` makes the stand-in do that for a share of its words,
drawn from a second RNG stream, so the words stay what they are at rate 0.

Tool calls: with `tool_call_rate` > 0, a prompt that offers functions (a `<tools>` block, as
Hermes and Qwen3 system prompts list them) and whose last turn is not a tool result is
answered, for that share of prompts (a third RNG stream), with one call to the first listed
function, `<tool_call>\n{"name": ..., "arguments": {}}\n</tool_call>`, in place of prose (after
the think block). A test double's choice, not a model of which calls a model makes: a
conversation whose recorded call is that one continues, any other diverges.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sglang_standin.steering import Steering
from sglang_standin.words import WORDS

THINK_START = "<think>"
THINK_END = "</think>"
EOS = "<|im_end|>"
GENERATION_PROMPT = "<|im_start|>assistant\n"

# Word forms: " word", "Word" (after a line break), " Word" (after a period).
_PLAIN, _CAP, _SPACE_CAP = 0, 1, 2
_ALT_STREAM = 0x6E6F_6E63_616E  # salt of the RNG stream that picks non-canonical splits
_TOOL_STREAM = 0x746F_6F6C  # salt of the RNG stream that decides whether to call a tool
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_TOOLS_BLOCK = re.compile(r"<tools>(.*?)</tools>", re.S)
_TOOL_RESULT_TURN = "<|im_start|>user\n<tool_response>"

# Per-unit probabilities of punctuation; the rest are plain " word" units.
_P_PARAGRAPH = 0.02
_P_SENTENCE = 0.07
_P_COMMA = 0.06


@dataclass(frozen=True)
class Completion:
    """Hold one completion: token ids as sampled, default text, and why it ended.

    `ids` include the matched stop token when `finish` is "stop" (SGLang's
    `output_ids_through_stop`); `text` is what SGLang answers with default
    `skip_special_tokens` (see `detokenize`).
    """

    ids: list[int]
    text: str
    finish: str  # "stop" or "length"
    matched_stop: int | None
    thinking: bool

    @property
    def completion_tokens(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class LengthModel:
    """Describe the natural (uncapped) output length: lognormal, clipped to [4, max_tokens]."""

    median_tokens: float = 300.0
    sigma: float = 0.9
    max_tokens: int = 16384


class CompletionWriter:
    """Turn (prompt, sampling params, cap) into a Completion for one tokenizer.

    Construction encodes the word list once; `write` then only concatenates cached ids and
    decodes once, so it costs O(output length) Python steps and no tokenization.
    """

    def __init__(
        self,
        tokenizer: Any,
        seed: int = 0,
        lengths: LengthModel | None = None,
        noncanonical_rate: float = 0.0,
        tool_call_rate: float = 0.0,
    ) -> None:
        self.tokenizer = tokenizer
        self.seed = seed
        self.lengths = lengths or LengthModel()
        self.noncanonical_rate = noncanonical_rate
        self.tool_call_rate = tool_call_rate

        def enc(text: str) -> list[int]:
            return list(tokenizer.encode(text, add_special_tokens=False))

        texts = (
            [" " + w for w in WORDS],
            [w.capitalize() for w in WORDS],
            [" " + w.capitalize() for w in WORDS],
        )
        self._forms = [[enc(t) for t in form] for form in texts]
        self._word = self._forms[_PLAIN]
        self._cap_word = self._forms[_CAP]
        self._single_idx = [i for i, ids in enumerate(self._word) if len(ids) == 1]
        if not self._single_idx:
            raise ValueError("tokenizer encodes no bundled word as a single token")
        # Built only when used: it encodes every cut of every word.
        self.splits = (
            noncanonical_splits(tokenizer, texts, self._forms) if noncanonical_rate > 0 else None
        )
        self._comma = enc(",")
        self._period = enc(".")
        self._paragraph = enc(".\n\n")
        self._newline = enc("\n")
        self._blank = enc("\n\n")
        vocab = tokenizer.get_vocab()
        self.eos_id: int = tokenizer.convert_tokens_to_ids(EOS)
        self.think_start_id: int | None = vocab.get(THINK_START)
        self.think_end_id: int | None = vocab.get(THINK_END)

    def thinks(self, prompt: str) -> bool:
        """Say whether the model would open a think block after this prompt (Qwen3-like)."""
        return self.think_start_id is not None and prompt.endswith(GENERATION_PROMPT)

    def write(self, prompt: str, sampling: dict[str, Any], limit: int | None,
              steering: Steering | None = None) -> Completion:
        """Return the completion for `prompt`; `limit` caps generated tokens (None: no cap).

        Length budgets count canonical tokens and the cap counts the ids emitted, so a
        non-canonical split lengthens the ids but never changes the words. `steering` (the
        request's `logit_bias` and `regex`): a certain id or a literal replaces the prose; an
        impossible stop id makes the answer run to `limit`, an impossible `</think>` leaves
        the think block open to the end.
        """
        steering = steering or Steering()
        thinking = self.thinks(prompt)
        if steering.forced is not None or steering.literal is not None:
            return self._steered(steering, limit, thinking)
        digest = _digest(self.seed, prompt, sampling)
        rng = random.Random(digest)
        alt = random.Random(digest ^ _ALT_STREAM) if self.splits is not None else None
        endless = self.eos_id in steering.banned
        open_think = self.think_end_id in steering.banned
        natural = self._natural_length(rng)
        if endless:  # longer than any cap: the cap ends it
            natural = (limit if limit is not None else self.lengths.max_tokens) + 8
        if thinking:
            frac = 1.0 if open_think else rng.uniform(0.55, 0.85)
            reasoning_len = max(1, round(natural * frac))
            content_len = max(2, natural - reasoning_len)
        else:
            reasoning_len = 0
            content_len = max(2, natural)
        stop_at = limit if limit is not None else math.inf
        ids: list[int] = []
        canon = 0
        if thinking:
            assert self.think_start_id is not None and self.think_end_id is not None
            ids.append(self.think_start_id)
            ids += self._newline
            canon = self._segment(rng, alt, ids, len(ids), reasoning_len, stop_at, closing=[])
            if not open_think:
                tail = [*self._newline, self.think_end_id, *self._blank]
                ids += tail
                canon += len(tail)
        call = self._tool_call(prompt, digest)
        if call is not None and not (thinking and open_think):
            ids += call
        elif not (thinking and open_think):
            self._segment(rng, alt, ids, canon, content_len, stop_at, closing=self._period)
        if not endless:
            ids.append(self.eos_id)
        if len(ids) > stop_at or endless:
            cut = ids[: int(min(stop_at, len(ids)))]
            return Completion(cut, detokenize(self.tokenizer, cut, None), "length", None, thinking)
        text = detokenize(self.tokenizer, ids, self.eos_id)
        return Completion(ids, text, "stop", self.eos_id, thinking)

    def _steered(self, steering: Steering, limit: int | None, thinking: bool) -> Completion:
        """Return a certain id at every step, or the literal the regex allows, then the stop."""
        cap = limit if limit is not None else self.lengths.max_tokens
        if steering.forced == self.eos_id or (steering.forced is None and cap == 0):
            ids = [self.eos_id][:cap]
        elif steering.forced is not None:
            ids = [steering.forced] * cap
        else:
            assert steering.literal is not None
            ids = [*self.tokenizer.encode(steering.literal, add_special_tokens=False),
                   self.eos_id]
        if len(ids) > cap or ids[-1:] != [self.eos_id]:
            cut = ids[:cap]
            return Completion(cut, detokenize(self.tokenizer, cut, None), "length", None, thinking)
        return Completion(ids, detokenize(self.tokenizer, ids, self.eos_id), "stop", self.eos_id,
                          thinking)

    def _tool_call(self, prompt: str, digest: int) -> list[int] | None:
        """Return the ids of a call to the prompt's first listed function, or None (prose)."""
        if self.tool_call_rate <= 0:
            return None
        last_turn = prompt[: -len(GENERATION_PROMPT)] if prompt.endswith(GENERATION_PROMPT) else ""
        if last_turn.rfind("<|im_start|>") == last_turn.rfind(_TOOL_RESULT_TURN) != -1:
            return None  # answering a tool result: prose
        name = first_tool_name(prompt)
        if name is None or random.Random(digest ^ _TOOL_STREAM).random() >= self.tool_call_rate:
            return None
        vocab = self.tokenizer.get_vocab()
        start, end = vocab.get(TOOL_CALL_START), vocab.get(TOOL_CALL_END)
        if start is None or end is None:
            return None
        body = json.dumps({"name": name, "arguments": {}})
        return [start, *self.tokenizer.encode(f"\n{body}\n", add_special_tokens=False), end]

    def _natural_length(self, rng: random.Random) -> int:
        lm = self.lengths
        draw = rng.lognormvariate(math.log(lm.median_tokens), lm.sigma)
        return int(min(max(draw, 4), lm.max_tokens))

    def _segment(
        self,
        rng: random.Random,
        alt: random.Random | None,
        ids: list[int],
        canon: int,
        length: int,
        stop_at: float,
        closing: list[int],
    ) -> int:
        """Append about `length` canonical tokens of prose to `ids` (whose canonical length is
        `canon`); return the new canonical length. Stops early once `stop_at` ids exist.

        Every unit ends in a word, so whatever follows (newline, special token) starts a new
        pre-token; `closing` (a final period) is appended only when it fits.
        """
        end = canon + length
        budget_end = end - len(closing)
        n_words = len(self._word)
        i = rng.randrange(n_words)
        if canon + len(self._cap_word[i]) <= budget_end:
            canon = self._put(ids, canon, [], _CAP, i, alt)
        else:
            canon = self._put(ids, canon, [], _PLAIN, rng.choice(self._single_idx), alt)
        while canon < budget_end and len(ids) < stop_at:
            r = rng.random()
            i = rng.randrange(n_words)
            if r < _P_PARAGRAPH:
                prefix, form = self._paragraph, _CAP
            elif r < _P_PARAGRAPH + _P_SENTENCE:
                prefix, form = self._period, _SPACE_CAP
            elif r < _P_PARAGRAPH + _P_SENTENCE + _P_COMMA:
                prefix, form = self._comma, _PLAIN
            else:
                prefix, form = [], _PLAIN
            if canon + len(prefix) + len(self._forms[form][i]) > budget_end:
                prefix, form, i = [], _PLAIN, self._single_idx[i % len(self._single_idx)]
            canon = self._put(ids, canon, prefix, form, i, alt)
        if canon + len(closing) <= end:
            ids += closing
            canon += len(closing)
        return canon

    def _put(
        self,
        ids: list[int],
        canon: int,
        prefix: list[int],
        form: int,
        i: int,
        alt: random.Random | None,
    ) -> int:
        word = self._forms[form][i]
        ids += prefix
        # One draw per word, split or not: which words are split must not depend on the vocab.
        if alt is not None and alt.random() < self.noncanonical_rate:
            assert self.splits is not None
            ids += self.splits[form][i] or word
        else:
            ids += word
        return canon + len(prefix) + len(word)


def first_tool_name(prompt: str) -> str | None:
    """Return the name of the first function the prompt's last ``<tools>`` block lists.

    Hermes lists a JSON array of ``{"type": "function", "function": {...}}``; Qwen3 one JSON
    object per line. None when there is no block or no name in it.
    """
    blocks = _TOOLS_BLOCK.findall(prompt)
    if not blocks:
        return None
    text = blocks[-1].strip()
    try:
        items = json.loads(text)
    except ValueError:
        items = []
        for line in text.splitlines():
            try:
                items.append(json.loads(line))
            except ValueError:
                continue
    for item in items if isinstance(items, list) else [items]:
        if isinstance(item, dict):
            fn = item.get("function", item)
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                return fn["name"]
    return None


def noncanonical_splits(
    tokenizer: Any, texts: Sequence[Sequence[str]], canonical: Sequence[Sequence[list[int]]]
) -> list[list[list[int] | None]]:
    """Return, per word form and word, real token ids that spell the word but are not what
    the tokenizer encodes it to; None where no cut into two pieces gives such ids.

    A candidate cuts the text in two and encodes each piece on its own (so every id is a real
    vocabulary token); the fewest ids win, then the cut nearest the middle.
    """
    pieces = sorted(
        {part for form in texts for t in form for k in range(1, len(t)) for part in (t[:k], t[k:])}
    )
    encoded = tokenizer(pieces, add_special_tokens=False)["input_ids"]
    ids_of = dict(zip(pieces, encoded, strict=True))
    out: list[list[list[int] | None]] = []
    for form_texts, form_ids in zip(texts, canonical, strict=True):
        row: list[list[int] | None] = []
        for text, canon in zip(form_texts, form_ids, strict=True):
            best: tuple[int, float] | None = None
            chosen: list[int] | None = None
            for k in range(1, len(text)):
                ids = [*ids_of[text[:k]], *ids_of[text[k:]]]
                rank = (len(ids), abs(k - len(text) / 2))
                if ids == canon or (best is not None and rank >= best):
                    continue
                if tokenizer.decode(ids) == text:
                    best, chosen = rank, ids
            row.append(chosen)
        out.append(row)
    return out


def detokenize(
    tokenizer: Any, ids: list[int], matched_stop: int | None, skip_special_tokens: bool = True
) -> str:
    """Return the text SGLang answers for sampled `ids`.

    A matched stop token is trimmed first (`managers/detokenizer_manager.py`,
    `trim_matched_stop`, which takes it to be the last id), then the rest is decoded with the
    request's `skip_special_tokens`, so `False` keeps every other special token.
    """
    if matched_stop is not None and ids:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def _digest(seed: int, prompt: str, sampling: dict[str, Any]) -> int:
    key = json.dumps([seed, prompt, sampling], sort_keys=True, ensure_ascii=False, default=str)
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
