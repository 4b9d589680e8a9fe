"""Write deterministic completions as real token ids of the served tokenizer.

A completion is a pure function of (server seed, prompt text, sampling params other than the
length cap): a hash seeds an RNG that draws a long-tailed natural length, then words from the
bundled list. `max_tokens` only cuts, so a capped completion is a prefix of the uncapped one.

Units are chosen so that each is whole pre-tokens under Qwen's split pattern (" word",
"," + " word", "." + " Word", ".\\n\\n" + "Word"), hence encode(decode(ids)) == ids and
completion_tokens is the count the tokenizer itself would give the text.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from typing import Any

from sglang_standin.words import WORDS

THINK_START = "<think>"
THINK_END = "</think>"
EOS = "<|im_end|>"
GENERATION_PROMPT = "<|im_start|>assistant\n"

# Per-unit probabilities of punctuation; the rest are plain " word" units.
_P_PARAGRAPH = 0.02
_P_SENTENCE = 0.07
_P_COMMA = 0.06


@dataclass(frozen=True)
class Completion:
    """Hold one completion: token ids as generated, text, and why it ended."""

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

    def __init__(self, tokenizer: Any, seed: int = 0, lengths: LengthModel | None = None) -> None:
        self.tokenizer = tokenizer
        self.seed = seed
        self.lengths = lengths or LengthModel()

        def enc(text: str) -> list[int]:
            return list(tokenizer.encode(text, add_special_tokens=False))

        self._word = [enc(" " + w) for w in WORDS]
        self._cap_word = [enc(w.capitalize()) for w in WORDS]
        self._space_cap_word = [enc(" " + w.capitalize()) for w in WORDS]
        self._single = [ids for ids in self._word if len(ids) == 1]
        if not self._single:
            raise ValueError("tokenizer encodes no bundled word as a single token")
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

    def write(self, prompt: str, sampling: dict[str, Any], limit: int | None) -> Completion:
        """Return the completion for `prompt`; `limit` caps generated tokens (None: no cap)."""
        rng = random.Random(_digest(self.seed, prompt, sampling))
        natural = self._natural_length(rng)
        thinking = self.thinks(prompt)
        if thinking:
            frac = rng.uniform(0.55, 0.85)
            reasoning_len = max(1, round(natural * frac))
            content_len = max(2, natural - reasoning_len)
        else:
            reasoning_len = 0
            content_len = max(2, natural)
        stop_at = limit if limit is not None else math.inf
        ids: list[int] = []
        if thinking:
            assert self.think_start_id is not None and self.think_end_id is not None
            ids.append(self.think_start_id)
            ids += self._newline
            self._segment(rng, ids, reasoning_len, stop_at, closing=[])
            ids += self._newline
            ids.append(self.think_end_id)
            ids += self._blank
        self._segment(rng, ids, content_len, stop_at, closing=self._period)
        ids.append(self.eos_id)
        if len(ids) > stop_at:
            cut = ids[: int(stop_at)]
            text = self.tokenizer.decode(cut, skip_special_tokens=True)
            return Completion(cut, text, "length", None, thinking)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(ids, text, "stop", self.eos_id, thinking)

    def _natural_length(self, rng: random.Random) -> int:
        lm = self.lengths
        draw = rng.lognormvariate(math.log(lm.median_tokens), lm.sigma)
        return int(min(max(draw, 4), lm.max_tokens))

    def _segment(
        self,
        rng: random.Random,
        ids: list[int],
        length: int,
        stop_at: float,
        closing: list[int],
    ) -> None:
        """Append about `length` tokens of prose, stopping early once `stop_at` ids exist.

        Every unit ends in a word, so whatever follows (newline, special token) starts a new
        pre-token; `closing` (a final period) is appended only when it fits.
        """
        end = len(ids) + length
        budget_end = end - len(closing)
        n_words = len(self._word)
        first = self._cap_word[rng.randrange(n_words)]
        ids += first if len(ids) + len(first) <= budget_end else rng.choice(self._single)
        while len(ids) < budget_end and len(ids) < stop_at:
            r = rng.random()
            i = rng.randrange(n_words)
            if r < _P_PARAGRAPH:
                unit = self._paragraph + self._cap_word[i]
            elif r < _P_PARAGRAPH + _P_SENTENCE:
                unit = self._period + self._space_cap_word[i]
            elif r < _P_PARAGRAPH + _P_SENTENCE + _P_COMMA:
                unit = self._comma + self._word[i]
            else:
                unit = self._word[i]
            if len(ids) + len(unit) > budget_end:
                unit = self._single[i % len(self._single)]
            ids += unit
        if len(ids) + len(closing) <= end:
            ids += closing


def split_reasoning(text: str) -> tuple[str | None, str]:
    """Split raw output like SGLang's qwen3 reasoning parser; return (reasoning, content).

    No `<think>` in the text: (None, text). Cut before `</think>`: (everything, ""). The caller
    maps "" to null where the emulated release does.
    """
    if THINK_START not in text:
        return None, text
    processed = text.replace(THINK_START, "").strip()
    if THINK_END not in processed:
        return processed, ""
    reasoning, rest = processed.split(THINK_END, 1)
    return reasoning, rest.strip()


def _digest(seed: int, prompt: str, sampling: dict[str, Any]) -> int:
    key = json.dumps([seed, prompt, sampling], sort_keys=True, ensure_ascii=False, default=str)
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
