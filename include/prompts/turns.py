"""Turn raw dataset turns into a chat prompt, and the key that decides duplicates."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Sequence

from include.conversations.tools import unwrap_tool_response
from include.prompts.schemas import ROLE_NAMES, RawTurn

Message = dict[str, str]


#: The multi-turn policies ``to_messages`` knows.
POLICIES = ("first_user", "until_first_trained_assistant", "until_last_user")
#: The policy of a source whose turns are ``all``: the whole conversation, original assistant
#: turns included (the engine regenerates each and pairs tool results with their calls).
WHOLE = "whole_conversation"
#: Drop details shared with the prepare stage's column-wise path for flat layouts.
EMPTY_DETAIL = "the last prompt turn is empty, white space or invisible characters"
#: A user turn inside a conversation that shows nothing (sent, it asks the target nothing).
EMPTY_TURN_DETAIL = "a user turn is empty, white space or invisible characters"
INVALID_UNICODE_DETAIL = "text holds invalid unicode (lone surrogates)"


class DropRow(Exception):
    """A row yields no prompt; ``reason`` is one of the funnel's drop reasons."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def to_messages(turns: Sequence[RawTurn], policy: str) -> list[Message]:
    """Map role names and cut the conversation to the prompt the policy asks for; raise DropRow.

    The policies: ``multi_turn`` in ``include.settings.fields`` (without loss flags in the set,
    ``until_first_trained_assistant`` stops at the first assistant turn), and ``WHOLE``.
    """
    if len(turns) == 1:
        return _one_turn(turns[0], policy)
    return _many_turns(turns, policy)


def _many_turns(turns: Sequence[RawTurn], policy: str) -> list[Message]:
    mapped: list[tuple[str, RawTurn]] = []
    for turn in turns:
        role = ROLE_NAMES.get(turn.role.strip().lower())
        if role is None:
            raise DropRow("unknown_role", f"role {turn.role!r}")
        mapped.append((role, turn))
    users = [i for i, (role, _) in enumerate(mapped) if role == "user"]
    if not users:
        raise DropRow("no_user_turn", f"roles {[r for r, _ in mapped]}")

    if policy == "first_user":
        first = users[0]
        kept = [(r, t) for r, t in mapped[:first] if r == "system"] + [mapped[first]]
    elif policy == "until_first_trained_assistant":
        cut = len(mapped)
        has_loss = any(t.loss is not None for r, t in mapped if r == "assistant")
        for i, (role, turn) in enumerate(mapped):
            if role == "assistant" and (turn.loss is True or not has_loss):
                cut = i
                break
        kept = mapped[:cut]
        if not any(r == "user" for r, _ in kept):
            raise DropRow("no_user_turn", "no user turn before the first trained assistant turn")
    elif policy == "until_last_user":
        kept = mapped[: users[-1] + 1]
    elif policy == WHOLE:
        # Hermes wraps tool results in <tool_response> itself; the chat template wraps them
        # again, so the dataset's own wrapper goes.
        kept = [(r, RawTurn(t.role, unwrap_tool_response(t.content), t.loss) if r == "tool" else t)
                for r, t in mapped]
    else:  # settings validation makes this unreachable; fail loudly rather than guess
        raise ValueError(f"unknown multi_turn policy {policy!r}")

    messages = [{"role": r, "content": t.content} for r, t in kept]
    if blank(messages[-1]["content"]) or all(blank(m["content"]) for m in messages):
        raise DropRow("empty", EMPTY_DETAIL)
    if any(m["role"] == "user" and blank(m["content"]) for m in messages):
        raise DropRow("empty", EMPTY_TURN_DETAIL)
    for m in messages:
        _check_encodable(m["content"])
    return messages


def _one_turn(turn: RawTurn, policy: str) -> list[Message]:
    # ``_many_turns`` for the commonest case (flat datasets: one user turn), without its
    # lists: every policy keeps a lone user turn whole. Same results, same errors, same order
    # of checks (tests compare the two).
    role = ROLE_NAMES.get(turn.role.strip().lower())
    if role is None:
        raise DropRow("unknown_role", f"role {turn.role!r}")
    if role != "user":
        raise DropRow("no_user_turn", f"roles {[role]}")
    if policy not in (*POLICIES, WHOLE):
        raise ValueError(f"unknown multi_turn policy {policy!r}")
    content = turn.content
    if blank(content):
        raise DropRow("empty", EMPTY_DETAIL)
    _check_encodable(content)
    return [{"role": "user", "content": content}]


def _check_encodable(text: str) -> None:
    if text.isascii():  # no surrogates possible
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise DropRow("malformed", INVALID_UNICODE_DETAIL) from None


_SPACE = re.compile(r"\s+")
_INVISIBLE_CHARS = "\u200b\u200c\u200d\u2060\ufeff"
_INVISIBLE = dict.fromkeys(map(ord, _INVISIBLE_CHARS))
#: Letters and symbols that render as nothing (fillers, the blank braille cell).
_BLANK_GLYPHS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def blank(text: str) -> bool:
    """Return whether ``text`` shows nothing: white space, format characters (U+200B, U+200D,
    U+2060, U+FEFF, soft hyphen...; Unicode category Cf) and blank fillers only."""
    stripped = text.strip()
    if not stripped:
        return True
    if stripped.isascii():
        return False
    return all(ch.isspace() or ch in _BLANK_GLYPHS or unicodedata.category(ch) == "Cf"
               for ch in stripped)


def _fold(text: str) -> str:
    # The reference form is ``_SPACE.sub(" ", NFKC(text).translate(_INVISIBLE)).strip()``;
    # this computes the same string faster (tests check the two agree): ASCII text is already
    # NFKC and holds no zero-width characters, ``str.replace`` per character deletes exactly
    # what ``translate`` does, and ``str.split()`` / ``str.strip()`` use the same white space
    # as ``\s`` in a str pattern (``str.isspace``), so split + join folds runs and strips ends.
    #
    # Most prompts are folded already; that is checked first, in C: ``isprintable()`` is
    # false for every white space character but the ASCII space (all are in categories Z* or
    # Cc) and for the zero-width ones (Cf), so a printable text without two spaces in a row
    # or a space at either end has nothing to delete, fold or strip.
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
        if not text.isprintable():
            for ch in _INVISIBLE_CHARS:
                if ch in text:
                    text = text.replace(ch, "")
    if text.isprintable() and "  " not in text and text[:1] != " " and text[-1:] != " ":
        return text
    return " ".join(text.split())


def normalized_text(messages: Sequence[Message]) -> str:
    """Return the form two prompts are compared in for exact dedupe.

    NFKC, zero-width characters removed, runs of white space folded to one space, ends
    stripped, per turn; roles kept, so the same user text under a different system prompt
    is a different prompt. Case is kept: in code and maths it changes meaning.
    """
    return "\x1e".join(m["role"] + "\x1f" + _fold(m["content"]) for m in messages)


def dedupe_key(messages: Sequence[Message]) -> bytes:
    """Return a 16-byte digest of the normalised prompt (the exact-dedupe key)."""
    return hashlib.blake2b(normalized_text(messages).encode("utf-8"), digest_size=16).digest()


def prompt_turns(messages: Sequence[Message]) -> list[Message]:
    """Return the turns before the first assistant turn (the prompt part of a conversation)."""
    out = []
    for m in messages:
        if m["role"] == "assistant":
            break
        out.append(m)
    return out
