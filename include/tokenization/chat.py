"""The chat tokenizer: the target's fast tokenizer, plus what the stage derives from it once.

Nothing here assumes a whitespace layout of the thinking block: the empty think block that
stands in for dropped reasoning is read off the chat template itself, and decoding token ids
back to bytes (to check them against the server's text) uses the tokenizer's own byte table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

from include.target_tokenizer import TokenizerError

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
END_OF_TURN = "<|im_end|>"
#: Tokens a Qwen3-family model ends a turn with (its generation config's eos ids).
STOP_TOKENS = (END_OF_TURN, "<|endoftext|>")


class ChatTokenizer:
    """The target tokenizer plus what this stage derives from it once (ids and tables)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        if self.backend is None:
            raise TokenizerError("the tokenization stage needs a fast (Rust) tokenizer")
        vocab = self.backend.get_vocab(with_added_tokens=True)
        if END_OF_TURN not in vocab:
            raise TokenizerError(f"the tokenizer has no {END_OF_TURN} token; expected ChatML")
        added = [t.content for t in self.backend.get_added_tokens_decoder().values()]
        self._byte_table = _byte_table(self.backend, vocab, set(added))
        self.end_of_turn_id: int = vocab[END_OF_TURN]
        self.stop_ids = frozenset(vocab[t] for t in STOP_TOKENS if t in vocab)
        self.think_close_id: int | None = vocab.get(THINK_CLOSE)
        self._empty_think: str | None = None

    def render_prompt(self, messages: list[dict[str, Any]], enable_thinking: bool) -> str:
        """Return the prompt exactly as the server renders it (generation prompt appended)."""
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
        )

    def opens_thinking(self, prompt: str) -> bool:
        """Return whether the template's generation prompt already opened the think block."""
        return prompt.endswith(THINK_OPEN + "\n")

    def empty_think_closing(self) -> str:
        """Return what the template renders after the thinking prompt, up to ``</think>``,
        when thinking is off: the empty think block that stands in for dropped reasoning.

        Read off the template (the thinking-off prompt minus the thinking-on one), so no
        whitespace convention is assumed; raise TokenizerError if it renders no such block.
        """
        if self._empty_think is None:
            messages = [{"role": "user", "content": "U"}]
            on = self.render_prompt(messages, True)
            off = self.render_prompt(messages, False)
            block = off[len(on):] if off.startswith(on) else ""
            if THINK_CLOSE not in block:
                raise TokenizerError(
                    "include_reasoning=false needs the chat template to render an empty think "
                    f"block when thinking is off; it renders {off[-40:]!r} after the prompt. "
                    "Use the model's own template, or include_reasoning=true."
                )
            self._empty_think = block[: block.index(THINK_CLOSE) + len(THINK_CLOSE)]
        return self._empty_think

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Return token ids of ``texts`` (no added BOS/EOS), batched on Rust threads."""
        if not texts:
            return []
        return [e.ids for e in self.backend.encode_batch_fast(texts, add_special_tokens=False)]

    def decodes_to(self, ids: Sequence[int], text: str) -> bool:
        """Return whether ``ids`` decode to exactly ``text`` (byte-level table, no cleanup;
        special tokens kept, as the engine asks the server to keep them).

        A model may sample byte tokens that are not valid UTF-8 (half a character, seen from
        the real SGLang): its text then holds U+FFFD where the bytes break, as the tokenizer's
        lossy decode writes them. Those ids still spell that text, and are what was sampled.
        """
        if self._byte_table is None:
            return self.backend.decode(list(ids), skip_special_tokens=False) == text
        table = self._byte_table
        if len(ids) < 2:  # itemgetter of one index returns the item, not a 1-tuple
            pieces: Sequence[bytes] = [table[i] for i in ids if 0 <= i < len(table)]
            return len(pieces) == len(ids) and _spells(b"".join(pieces), text)
        if min(ids) < 0:  # a negative index would read the table from its end
            return False
        try:
            # itemgetter looks every id up in C: no Python step per token.
            return _spells(b"".join(itemgetter(*ids)(table)), text)
        except IndexError:
            return False


def _spells(data: bytes, text: str) -> bool:
    """Return whether ``data`` is ``text`` in UTF-8, or decodes to it with U+FFFD (lossy)."""
    encoded = text.encode("utf-8", errors="surrogatepass")
    return data == encoded or ("\ufffd" in text and data.decode("utf-8", "replace") == text)


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
