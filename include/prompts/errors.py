"""The prepare stage's own error, raised by its several parts (funnel, dedupe, shards)."""


class PrepareError(RuntimeError):
    """The prepare stage cannot go on; the message names the source or setting to fix."""
