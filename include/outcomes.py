"""The words every stage uses for how things ended, in a leaf under all who read them.

How a prompt ended (``PromptStatus``), why a request failed and whether another try can help
(``ErrorKind``, ``RETRYABLE``), a server's place in the pool (``ServerStatus``), the journal's
per-turn record kinds, and the error a shard run stops with. The engine decides these,
durability writes and reads them, conversations, reporting and the monitor count them: held
here, none of those reaches up to the engine for a word. No imports from ``include``.
"""

from __future__ import annotations

from enum import StrEnum


class PromptStatus(StrEnum):
    """How a prompt ended in a shard run: its final journal record's ``status``."""

    COMPLETED = "completed"
    SKIPPED = "skipped"
    FAILED = "failed"


class ErrorKind(StrEnum):
    """Why a request failed (``ChatResult.error_kind``, a failed record's ``reason``).

    The first three are also ``include.sglang.contract.Failure``'s words (a failure before any
    HTTP answer), so a failure reads one way in the journal, the logs and the monitor.
    """

    CONNECT = "connect_error"  # refused / reset before a response: likely down
    DISCONNECTED = "disconnected"  # closed mid-request
    TIMEOUT = "timeout"
    HTTP_5XX = "http_5xx"
    QUEUE_FULL = "queue_full"  # 503 "The request queue is full."
    LENGTH = "length_error"  # one of SGLang's three 400 length errors
    UNAUTHORIZED = "unauthorized"  # 401: the API key is wrong; no retry can fix it
    HTTP_4XX = "http_4xx"
    BAD_RESPONSE = "bad_response"  # 200 with a body that is not a chat completion
    CANCELLED = "cancelled"  # taken back by the engine (server ejected while in flight)


#: The kinds that can succeed on another try or another server.
RETRYABLE = frozenset({ErrorKind.CONNECT, ErrorKind.DISCONNECTED, ErrorKind.TIMEOUT,
                       ErrorKind.HTTP_5XX, ErrorKind.QUEUE_FULL, ErrorKind.CANCELLED})


class ServerStatus(StrEnum):
    """A server's state in the pool: the one spelling logs, summaries and affinity use."""

    IN_ROTATION = "in rotation"
    RESTING = "resting"
    EJECTED = "ejected"


#: Journal record kinds of a whole conversation (``turns: all``): one per finished turn, one
#: when the conversation ends; a prompt's final record has no kind.
TURN_KIND = "conversation_turn"
END_KIND = "conversation_end"


class GenerationError(RuntimeError):
    """The shard cannot go on; finished prompts are safe in the journal."""
