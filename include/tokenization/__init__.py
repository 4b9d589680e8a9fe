"""Tokenizer access shared by every stage, and (later) the tokenization stage itself."""

from include.tokenization.tokenizer import (
    TokenizerError,
    count_prompt_tokens,
    load_tokenizer,
    render_prompts,
)

__all__ = ["TokenizerError", "count_prompt_tokens", "load_tokenizer", "render_prompts"]
