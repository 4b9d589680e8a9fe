"""The generate task's start: its first requests leave before the tokenizer has loaded.

Loading the target tokenizer (importing transformers, reading ``tokenizer.json``) takes
seconds, and counting a prompt needs it. ``PromptCounter`` loads it on a thread from the
task's first moment; until it is ready, ``take_sure_fits`` sends the prompts whose token count
cannot matter: each token of a rendered prompt is at least one of its bytes, and the render
is bounded by the chat template's size and the messages' bytes, so a prompt whose bound
leaves the whole ``max_tokens`` cap gets the budget an exact count gives (``min(cap,
C - P - margin)`` is the cap for every P below the bound). Every other prompt, and every
whole conversation, is counted exactly once the tokenizer is there. A bound that were ever
wrong is still caught by the server (a prompt over the context is refused and rebudgeted
from the server's own count, see ``retry``).
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from include.sglang.length import BudgetRule

#: Bytes a render may add beyond the template's text and the messages: special-token values
#: (``bos_token`` and the like) are longer than their names in the template.
SPECIAL_TOKEN_SLACK = 256


def template_bytes(tokenizer_path: str) -> int | None:
    """Return the size of the chat template in a local tokenizer directory, or None.

    ``chat_template.jinja`` (how transformers saves it now), else every template of
    ``tokenizer_config.json``'s ``chat_template`` (a string or a list of named ones). None
    (a hub id, an unreadable file): no bound, every prompt is counted.
    """
    folder = Path(tokenizer_path)
    try:
        jinja = folder / "chat_template.jinja"
        if jinja.is_file():
            return len(jinja.read_bytes())
        template = json.loads((folder / "tokenizer_config.json").read_text()).get(
            "chat_template")
    except (OSError, ValueError):
        return None
    if isinstance(template, list):
        template = "".join(str(t.get("template") or "") for t in template
                           if isinstance(t, dict))
    return len(template.encode()) if isinstance(template, str) and template else None


class PromptCounter:
    """Counts prompt tokens with the target tokenizer, loaded on a thread from construction.

    Called as ``counter(conversations, enable_thinking=...)`` it returns P per conversation
    (``include.target_tokenizer.count_prompt_tokens``), waiting for the tokenizer if need be; a
    failed load raises its error there.
    """

    def __init__(self, tokenizer_path: str, enable_thinking: bool) -> None:
        self.enable_thinking = enable_thinking
        self._template = template_bytes(tokenizer_path)
        self._loaded: Future[Any] = Future()
        # A daemon: a task that ends early (a lost lease) never waits on an unused load.
        threading.Thread(target=self._load, args=(tokenizer_path,), daemon=True,
                         name="tokenizer-load").start()

    def _load(self, path: str) -> None:
        try:
            from include.target_tokenizer import load_tokenizer

            self._loaded.set_result(load_tokenizer(path))
        except BaseException as exc:  # noqa: BLE001 - raised where the tokenizer is used
            self._loaded.set_exception(exc)

    @property
    def tokenizer(self) -> Any:
        """The tokenizer (waits for the load; raises its error)."""
        return self._loaded.result()

    def ready(self) -> bool:
        """Return whether the tokenizer is loaded (or failed to)."""
        return self._loaded.done()

    def __call__(self, conversations: Sequence[list[dict[str, Any]]],
                 enable_thinking: bool | None = None) -> list[int]:
        from include.target_tokenizer import count_prompt_tokens

        thinking = self.enable_thinking if enable_thinking is None else enable_thinking
        return count_prompt_tokens(self.tokenizer, conversations, thinking)

    def upper_bound(self, messages: list[dict[str, Any]]) -> int | None:
        """Return a bound on P for ``messages`` (None without a template to bound by).

        The template's text at most once per message and once outside its loops, the
        messages' values (as JSON, every field) at most twice, plus special-token values.
        """
        if self._template is None:
            return None
        values = len(json.dumps(messages, ensure_ascii=False).encode())
        return self._template * (len(messages) + 1) + 2 * values + SPECIAL_TOKEN_SLACK


def take_sure_fits(unplanned: collections.deque[dict[str, Any]], counter: Any, rule: BudgetRule,
                   limit: int) -> list[tuple[dict[str, Any], int]]:
    """Take off the front of ``unplanned``, while ``counter``'s tokenizer is still loading,
    up to ``limit`` single-turn prompts whose bound gets the whole cap from ``rule``; return
    each with its bound. Nothing once the tokenizer is ready, for a counter that cannot bound
    (a plain function), or when the front prompt needs its exact count (it waits for the
    tokenizer).
    """
    from include.engine.conversing import is_conversation

    if getattr(counter, "ready", None) is None or counter.ready():
        return []
    taken = []
    while unplanned and len(taken) < limit:
        record = unplanned[0]
        bound = None if is_conversation(record) else counter.upper_bound(record["messages"])
        if bound is None or rule.budget(bound).max_tokens < rule.cap:
            break
        taken.append((unplanned.popleft(), bound))
    return taken
