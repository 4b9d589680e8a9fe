from tests.fixtures.standins import tokenizer_dir  # noqa: F401
