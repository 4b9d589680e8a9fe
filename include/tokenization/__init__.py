"""Tokenizer access shared by every stage, and the tokenization stage itself."""

from include.target_tokenizer import (
    TokenizerError,
    count_prompt_tokens,
    load_tokenizer,
    render_prompts,
)
from include.tokenization.assembly import TokenizeOptions
from include.tokenization.chat import ChatTokenizer
from include.tokenization.checks import tokenize_completions
from include.tokenization.outputs import (
    DROP_REASONS,
    QUALITY_REASONS,
    QUARANTINE_REASONS,
    Sample,
    TokenizeResult,
)
from include.tokenization.stage import tokenize_shard

__all__ = [
    "DROP_REASONS",
    "QUALITY_REASONS",
    "QUARANTINE_REASONS",
    "ChatTokenizer",
    "Sample",
    "TokenizeOptions",
    "TokenizeResult",
    "TokenizerError",
    "count_prompt_tokens",
    "load_tokenizer",
    "render_prompts",
    "tokenize_completions",
    "tokenize_shard",
]
