"""Load the target model's tokenizer and count prompt tokens exactly as SGLang does.

SGLang counts P (the prompt's tokens) by applying the model's chat template with the
generation prompt appended, then encoding without extra special tokens. Every stage that needs
P (the length filter at preparation, the token budget at generation) calls
``count_prompt_tokens`` so the numbers cannot drift apart.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

# Without PyTorch (not needed: tokenizers only) transformers logs a "PyTorch was not found"
# advisory at import, which Airflow's task log shows as an ERROR line in successful tasks.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


class TokenizerError(RuntimeError):
    """The tokenizer could not be loaded or cannot render a prompt."""


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str) -> Any:
    """Return ``AutoTokenizer.from_pretrained(path)``; it must carry a chat template."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # transformers raises many types (OSError, ValueError, HF errors)
        raise TokenizerError(
            f"tokenizer_path {path!r}: cannot load a tokenizer ({type(exc).__name__}: {exc}). "
            "Point tokenizer_path at a local directory with tokenizer.json, or a hub id "
            "reachable from this worker."
        ) from exc
    if not getattr(tok, "chat_template", None):
        raise TokenizerError(
            f"tokenizer_path {path!r}: the tokenizer has no chat template; the servers apply "
            "one, so token counts would be wrong. Use the model's own tokenizer directory."
        )
    return tok


def render_prompts(
    tokenizer: Any, conversations: Sequence[list[dict[str, str]]], enable_thinking: bool = True
) -> list[str]:
    """Return each conversation rendered by the chat template with the generation prompt."""
    return [
        tokenizer.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
        )
        for msgs in conversations
    ]


def count_prompt_tokens(
    tokenizer: Any, conversations: Sequence[list[dict[str, str]]], enable_thinking: bool = True
) -> list[int]:
    """Return P for each conversation: tokens of the chat-templated prompt, as the server counts."""
    if not conversations:
        return []
    texts = render_prompts(tokenizer, conversations, enable_thinking)
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [len(ids) for ids in encoded]
