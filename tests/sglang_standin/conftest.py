"""Fixtures for the stand-in tests: one small tokenizer per session, servers in a thread."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_standin.testing import ThreadServer
from sglang_standin.tokenizer import build_chat_tokenizer


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chat_tokenizer(tmp_path_factory.mktemp("tok") / "small")


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)


ServerFactory = Callable[..., ThreadServer]

# Fast defaults for tests: tiny warm-up, 100x faster performance model, short outputs.
FAST_FLAGS: dict[str, Any] = {
    "standin_warmup_seconds": 0.05,
    "standin_time_scale": 0.01,
    "standin_median_output_tokens": 60,
}


@pytest.fixture
def make_server(tokenizer: Any, tokenizer_dir: Path) -> Iterator[ServerFactory]:
    """Return a factory: make_server(wait=True, **flags) -> a running ThreadServer."""
    servers: list[ThreadServer] = []

    def factory(wait: bool = True, **flags: Any) -> ThreadServer:
        server = ThreadServer.start(tokenizer, tokenizer_dir, wait, **{**FAST_FLAGS, **flags})
        servers.append(server)
        return server

    yield factory
    for server in servers:
        server.close()
