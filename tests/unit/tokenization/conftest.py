"""A small local ChatML-with-thinking tokenizer (built offline by sglang_standin) per session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sglang_standin.tokenizer import build_chat_tokenizer


@pytest.fixture(scope="session")
def chat_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chat_tokenizer(tmp_path_factory.mktemp("tok") / "small", vocab="small")


@pytest.fixture(scope="session")
def hf_tokenizer(chat_tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(chat_tokenizer_dir), local_files_only=True)
