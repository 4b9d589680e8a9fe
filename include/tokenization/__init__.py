"""The tokenization stage: completions in, training rows out (the target's tokenizer is
``include.target_tokenizer``, a leaf every stage imports directly)."""

from include.tokenization.assembly import TokenizeOptions
from include.tokenization.chat import ChatTokenizer
from include.tokenization.checks import tokenize_completions
from include.tokenization.outputs import (
    QUALITY_REASONS,
    QUARANTINE_REASONS,
    TOKENIZE_DROP_REASONS,
    Sample,
    TokenizeResult,
)
from include.tokenization.stage import tokenize_shard

__all__ = [
    "TOKENIZE_DROP_REASONS",
    "QUALITY_REASONS",
    "QUARANTINE_REASONS",
    "ChatTokenizer",
    "Sample",
    "TokenizeOptions",
    "TokenizeResult",
    "tokenize_completions",
    "tokenize_shard",
]
