"""The chat tokenizer: the target's fast tokenizer, plus what the stage derives from it once.

The stage assembles each sample in the ChatML-with-thinking layout of the Qwen3 family
(``<think>\\nREASONING\\n</think>\\n\\nCONTENT<|im_end|>``) and encodes prompt and assistant
text apart; this module checks the template renders that layout, proves where the two
encodings may be joined, and decodes token ids back to bytes to check them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from include.tokenization.tokenizer import TokenizerError

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
END_OF_TURN = "<|im_end|>"
EMPTY_THINK = "<think>\n\n</think>\n\n"

# The right-hand window of the junction proof: past the completion's leading whitespace run
# (whose regex alternatives backtrack over the whole run) plus this many characters.
_JUNCTION_LOOKAHEAD = 16
_JUNCTION_MAX_SCAN = 256


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
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    if not isinstance(backend.decoder, decoders.ByteLevel):
        return None
    char_to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
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
