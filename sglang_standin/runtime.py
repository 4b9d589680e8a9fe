"""Process-level pieces of the stand-in: logging, start-up checks, the event loop, crashing."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from sglang_standin.cli import ServerConfig, parse_args
from sglang_standin.errors import served_name_error

if TYPE_CHECKING:
    from sglang_standin.server import StandinServer

logger = logging.getLogger("sglang_standin")
CRASH_EXIT_CODE = 1


def crash(reason: str) -> None:
    """Exit the process at once, as a crashed server would: no cleanup, connections refused."""
    logger.error("stand-in fault: crashing (%s)", reason)
    for handler in logging.getLogger().handlers + logger.handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(CRASH_EXIT_CODE)


def load_tokenizer(config: ServerConfig) -> Any:
    """Load the tokenizer from the local tokenizer path (never from a hub)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(config.effective_tokenizer_path, local_files_only=True)


def configure_logging(level: str) -> None:
    """Log like SGLang: `[YYYY-mm-dd HH:MM:SS] message` on stdout."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S"))
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


def server_args_line(config: ServerConfig) -> str:
    """Return the start-up line SGLang logs, API key included.

    v0.5.23 `entrypoints/engine.py` logs `server_args={dict}` (`_server_args_for_logging`,
    a plain dict); v0.5.6 logs `f"{server_args=}"`, the dataclass repr `ServerArgs(...)`.
    """
    args = config.sglang_args(reveal_key=True)
    if config.version == "v0.5.6":
        return "server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"
    return f"server_args={args!r}"


async def serve(config: ServerConfig, server: StandinServer | None = None) -> None:
    """Run a server (``server``, or a plain stand-in of ``config``) until SIGTERM or SIGINT."""
    if server is None:
        from sglang_standin.server import StandinServer

        server = StandinServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    await stop.wait()
    logger.info("stand-in: shutting down")
    await server.stop()


def main(argv: list[str] | None = None) -> None:
    """Entry point of `python -m sglang_standin`."""
    config = parse_args(argv)
    configure_logging(config.log_level)
    # SGLang validates its arguments before it logs them; an AssertionError ends the
    # process with status 1 and the traceback in the log, as `check_server_args` does.
    problem = served_name_error(config.effective_served_model_name)
    if problem:
        raise AssertionError(problem)
    # SGLang logs its whole ServerArgs, API key included, at start; so does the stand-in, so
    # tests see what a real server log holds (and that log tails are redacted before use).
    logger.info(server_args_line(config))
    if not os.path.isdir(config.effective_tokenizer_path):
        # Fail before the slow transformers import; SGLang would fail to load it as well.
        logger.error(
            "stand-in: tokenizer path %s is not a local directory", config.effective_tokenizer_path
        )
        raise SystemExit(2)
    if config.ignored_args:
        logger.info(
            "stand-in: ignoring SGLang flags it does not model: %s", " ".join(config.ignored_args)
        )
    asyncio.run(serve(config))
