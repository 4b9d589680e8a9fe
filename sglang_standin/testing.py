"""Help tests talk to a stand-in: run one in a thread of the test process, call it with urllib.

`ThreadServer` costs no new process (the tokenizer object can be shared), so a test can start
many servers with different flags cheaply. Crash faults call os._exit and would end the test
process: use `sglang_standin.process.start_standin` for those.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sglang_standin.cli import parse_args
from sglang_standin.process import flags_to_argv, free_port
from sglang_standin.server import StandinServer


@dataclass
class Reply:
    """Hold one HTTP answer; `json()` parses the body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def call(
    method: str,
    url: str,
    payload: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 20.0,
    raw: bytes | None = None,
) -> Reply:
    """Send one HTTP request with the stdlib and return status, headers and body (no raise)."""
    data = raw if raw is not None else (None if payload is None else json.dumps(payload).encode())
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        req.add_header(key, value)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Reply(resp.status, dict(resp.headers), resp.read())
    except urllib.error.HTTPError as err:
        return Reply(err.code, dict(err.headers), err.read())


class ThreadServer:
    """Run a StandinServer on its own event loop in a daemon thread (cheap: no new process).

    `tokenizer` is a loaded tokenizer shared with the caller (loading is the slow part);
    `argv` is a `python -m sglang_standin` command line. Call `close()` when done.
    """

    def __init__(self, tokenizer: Any, argv: list[str],
                 make: Callable[..., StandinServer] = StandinServer) -> None:
        self.config = parse_args(argv)
        self.url = f"http://{self.config.host}:{self.config.port}"
        self.loop = asyncio.new_event_loop()
        self.server: StandinServer | None = None
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self.loop)

            async def boot() -> None:
                self.server = make(self.config, tokenizer=tokenizer)
                await self.server.start()

            try:
                self.loop.run_until_complete(boot())
            except BaseException as exc:  # reported to the constructing thread below
                failure.append(exc)
                started.set()
                return
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True, name="standin-thread-server")
        self.thread.start()
        if not started.wait(30):
            raise RuntimeError("thread server did not start within 30 s")
        if failure:
            raise failure[0]

    @classmethod
    def start(
        cls, tokenizer: Any, model_path: str | os.PathLike[str], wait: bool = True,
        make: Callable[..., StandinServer] = StandinServer, **flags: Any
    ) -> ThreadServer:
        """Start a server on a free port with keyword flags (as in `start_standin`); ``make``
        builds it from its config and tokenizer (a ``StandinServer`` subclass, say)."""
        argv = ["--model-path", str(model_path), "--port", str(free_port())]
        server = cls(tokenizer, argv + flags_to_argv(flags), make)
        if wait:
            server.wait_ready()
        return server

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until warm-up has ended (/health would answer 200)."""
        assert self.server is not None
        asyncio.run_coroutine_threadsafe(self.server.ready.wait(), self.loop).result(timeout)

    def close(self) -> None:
        """Stop the server and its loop thread."""
        assert self.server is not None
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class HasUrl(Protocol):
    """Anything with a base URL: ThreadServer, StandinProcess."""

    @property
    def url(self) -> str: ...


def chat(
    server: HasUrl | str,
    content: str = "What is two plus two?",
    headers: dict[str, str] | None = None,
    timeout: float = 20.0,
    **extra: Any,
) -> Reply:
    """POST a one-message chat completion to `server` (an object with `.url`, or a base URL).

    `extra` goes into the body (max_tokens, chat_template_kwargs, ...).
    """
    base = server if isinstance(server, str) else server.url
    body = {"model": "whatever", "messages": [{"role": "user", "content": content}], **extra}
    return call("POST", base + "/v1/chat/completions", body, headers, timeout)


def read_sampled_log(folder: str | os.PathLike[str]) -> dict[tuple[int, ...], list[list[int]]]:
    """Return what the stand-ins logged as sampled (``--standin-sampled-log-dir``): per prompt
    ids, every list of ids sampled for it (a prompt answered twice is listed twice)."""
    from pathlib import Path

    sampled: dict[tuple[int, ...], list[list[int]]] = {}
    for log_file in sorted(Path(folder).glob("sampled-*.jsonl")):
        for line in log_file.read_text().splitlines():
            entry = json.loads(line)
            sampled.setdefault(tuple(entry["prompt_ids"]), []).append(entry["sampled_ids"])
    return sampled
