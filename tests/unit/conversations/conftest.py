"""The stand-in's small ChatML-with-thinking tokenizer, built offline once per session."""

from __future__ import annotations

from typing import Any

import pytest

from sglang_standin.tokenizer import build_chat_tokenizer


@pytest.fixture(scope="session")
def standin_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    path = build_chat_tokenizer(tmp_path_factory.mktemp("tok") / "small", vocab="small")
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
