"""The storage errors, apart so that locations and stores can share them without a cycle."""

from __future__ import annotations


class StoreError(RuntimeError):
    """A storage operation failed; the message names the location and what to do."""


class ObjectExistsError(StoreError):
    """A different object already exists at the key; nothing was overwritten."""
