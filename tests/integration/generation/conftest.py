"""Stand-in servers for the engine's integration tests."""

from tests.fixtures.standins import standins, tokenizer_dir  # noqa: F401
