"""Preflight of a turns: all run against a real stand-in: the request the run sends first.

The stand-in checks lengths as SGLang 0.5.23 does (P + max_tokens > C is rejected) and logs
the prompt ids it answered, so what preflight sent is read back from the server itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from include.engine.conversing import first_request
from include.servers.first_requests import preflight_run
from include.target_tokenizer import count_prompt_tokens, load_tokenizer
from tests.fixtures.standins import standins  # noqa: F401 - the fixture is used by name

pytestmark = pytest.mark.integration

CONTEXT = 1024


def long_chat(i: int) -> dict:
    """Three user turns, each answered in the dataset at length: the whole conversation is
    longer than CONTEXT, each turn's request (with the target's short answers) is not."""
    messages = []
    for k in range(3):
        messages += [{"role": "user", "content": f"Question {i}.{k}: " + "river stone " * (30 + i)},
                     {"role": "assistant", "content": "garden window " * 400}]
    return {"id": f"chat:{i}", "source": "chat", "metadata": {}, "messages": messages,
            "turns": "all", "call_format": "tool_call"}


def test_a_run_whose_whole_conversations_exceed_the_context_passes_preflight(
    standins, tokenizer_dir: Path, tmp_path: Path  # noqa: F811
) -> None:
    logs = tmp_path / "sampled"
    [server] = standins(1, context_length=CONTEXT, served_model_name="standin-qwen",
                        standin_sampled_log_dir=str(logs))
    tok = load_tokenizer(str(tokenizer_dir))
    prompts = [long_chat(i) for i in range(3)]
    assert count_prompt_tokens(tok, [prompts[0]["messages"]], True)[0] > CONTEXT
    settings = SimpleNamespace(
        context_length=CONTEXT, max_tokens=256, context_margin=16, min_completion_tokens=16,
        tokenizer_path=str(tokenizer_dir), model_path=str(tokenizer_dir), enable_thinking=True,
        temperature=0.6, top_p=0.95, top_k=20, model_name="standin-qwen",
        api_key=None, request_timeout_s=30.0)
    log = preflight_run(settings, [server.url], prompts)
    assert "(a whole conversation's first turn)" in log
    [entry] = [json.loads(line) for f in logs.glob("sampled-*.jsonl")
               for line in f.read_text().splitlines()]
    sent = tok.decode(entry["prompt_ids"])
    first = tok.apply_chat_template(first_request(prompts[2]), tokenize=False,
                                    add_generation_prompt=True)
    assert sent == first  # the longest first turn, ending on its user turn
    assert sent.endswith("<|im_start|>user\n" + prompts[2]["messages"][0]["content"]
                         + "<|im_end|>\n<|im_start|>assistant\n")
