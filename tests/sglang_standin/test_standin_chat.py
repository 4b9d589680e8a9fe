"""Chat completions as v0.5.23 answers them (token ids, raw text, usage); where v0.5.6 differs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sglang_standin.server import StandinServer
from sglang_standin.testing import ThreadServer, call, chat

ServerFactory = Callable[..., ThreadServer]


def _template_ids(tokenizer: Any, content: str, **kwargs: Any) -> list[int]:
    msgs = [{"role": "user", "content": content}]
    enc = tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, **kwargs)
    return list(enc["input_ids"])


def test_return_token_ids_gives_the_prompt_and_sampled_ids(
    make_server: ServerFactory, tokenizer: Any
) -> None:
    server = make_server(reasoning_parser="qwen3")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    body = chat(server, "Why?", return_token_ids=True, separate_reasoning=False).json()
    choice, usage = body["choices"][0], body["usage"]
    assert list(choice)[-2:] == ["prompt_token_ids", "response_token_ids"]
    assert choice["prompt_token_ids"] == _template_ids(tokenizer, "Why?")
    assert len(choice["prompt_token_ids"]) == usage["prompt_tokens"]
    sampled = choice["response_token_ids"]
    # output_ids_through_stop (schedule_batch.py): the matched stop token is included.
    assert choice["finish_reason"] == "stop" and sampled[-1] == eos == choice["matched_stop"]
    assert len(sampled) == usage["completion_tokens"]
    assert tokenizer.decode(sampled[:-1], skip_special_tokens=False) == choice["message"]["content"]
    cut = chat(server, "Why?", return_token_ids=True, max_tokens=6).json()["choices"][0]
    assert cut["finish_reason"] == "length" and len(cut["response_token_ids"]) == 6
    assert cut["response_token_ids"] == sampled[:6] and eos not in cut["response_token_ids"]
    only_prompt = chat(server, "Why?", return_prompt_token_ids=True).json()["choices"][0]
    assert only_prompt["prompt_token_ids"] == choice["prompt_token_ids"]
    assert "response_token_ids" not in only_prompt
    plain = chat(server, "Why?").json()["choices"][0]
    assert "prompt_token_ids" not in plain and "response_token_ids" not in plain


def test_v0_5_6_ignores_the_token_id_fields(make_server: ServerFactory) -> None:
    server = make_server(standin_version="v0.5.6")
    choice = chat(server, "Why?", return_token_ids=True, return_prompt_token_ids=True).json()
    assert "prompt_token_ids" not in choice["choices"][0]
    assert "response_token_ids" not in choice["choices"][0]
    streamed = chat(server, "Why?", stream=True, return_token_ids=True).json()
    assert streamed["message"] == "the stand-in does not model streaming"


def test_streaming_with_token_ids_is_refused_with_sglangs_message(
    make_server: ServerFactory,
) -> None:
    server = make_server()

    def refusal(**extra: Any) -> tuple[int, str, str]:
        reply = chat(server, "Why?", stream=True, **extra)
        return reply.status, reply.json()["type"], reply.json()["message"]

    # serving_chat.py _convert_to_internal_request raises ValueError: type "BadRequest".
    assert refusal(return_token_ids=True) == (
        400,
        "BadRequest",
        "return_token_ids is not supported with streaming on /v1/chat/completions. "
        "Please set stream=false when using return_token_ids=true.",
    )
    assert refusal(return_prompt_token_ids=True, return_token_ids=True) == (
        400,
        "BadRequest",
        "return_prompt_token_ids is not supported with streaming. "
        "Please set stream=false when using return_prompt_token_ids=true.",
    )
    assert refusal() == (400, "Bad Request", "the stand-in does not model streaming")


def test_text_is_the_decoded_ids_minus_the_stop_and_skip_special_tokens_is_honoured(
    make_server: ServerFactory, tokenizer: Any
) -> None:
    server = make_server()
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}, "return_token_ids": True}
    default = chat(server, "Hi", **kwargs).json()["choices"][0]
    kept = chat(server, "Hi", skip_special_tokens=False, **kwargs).json()["choices"][0]
    ids = default["response_token_ids"]
    assert kept["response_token_ids"] == ids  # a detokenizer option: the same sample
    assert default["message"]["content"] == tokenizer.decode(ids[:-1], skip_special_tokens=True)
    assert kept["message"]["content"] == tokenizer.decode(ids[:-1], skip_special_tokens=False)
    assert "<|im_end|>" not in kept["message"]["content"]  # the matched stop is trimmed
    gen = call(
        "POST", server.url + "/generate",
        {"text": "Hi", "sampling_params": {"max_new_tokens": 500, "skip_special_tokens": False}},
    ).json()  # fmt: skip
    assert gen["output_ids"][-1] == gen["meta_info"]["finish_reason"]["matched"]
    assert gen["text"] == tokenizer.decode(gen["output_ids"][:-1], skip_special_tokens=False)
    assert chat(server, "Hi", skip_special_tokens="maybe").status == 400


@pytest.mark.parametrize("version", ["v0.5.23", "v0.5.6"])
def test_reasoning_tokens_in_usage(
    make_server: ServerFactory, version: str, tokenizer: Any
) -> None:
    server = make_server(reasoning_parser="qwen3", standin_version=version)
    body = chat(server, "Why?", return_token_ids=True).json()
    usage = body["usage"]
    if version == "v0.5.6":
        assert usage["reasoning_tokens"] == 0 and "completion_tokens_details" not in usage
        return
    # schedule_batch.py update_reasoning_tokens: sampled ids through </think>.
    ids = body["choices"][0]["response_token_ids"]
    through = ids.index(tokenizer.convert_tokens_to_ids("</think>")) + 1
    assert usage["reasoning_tokens"] == through
    assert usage["completion_tokens_details"] == {"reasoning_tokens": through}
    off = chat(server, "Why?", chat_template_kwargs={"enable_thinking": False}).json()["usage"]
    assert off["reasoning_tokens"] == 0 and off["completion_tokens_details"] is None


def test_noncanonical_rate_changes_the_ids_not_the_text(
    make_server: ServerFactory, tokenizer: Any
) -> None:
    kwargs = {"return_token_ids": True, "separate_reasoning": False}
    canonical = chat(make_server(), "Why?", **kwargs).json()["choices"][0]
    split = chat(make_server(standin_noncanonical_rate=0.5), "Why?", **kwargs).json()
    choice = split["choices"][0]
    text = choice["message"]["content"]
    assert text == canonical["message"]["content"]
    assert choice["response_token_ids"] != canonical["response_token_ids"]
    assert len(choice["response_token_ids"]) == split["usage"]["completion_tokens"]
    assert tokenizer.decode(choice["response_token_ids"][:-1]) == text
    # Re-tokenizing the text gives the canonical ids, not the sampled ones.
    assert tokenizer.encode(text, add_special_tokens=False) == canonical["response_token_ids"][:-1]


def test_request_validation_order_and_lora_model_names(make_server: ServerFactory) -> None:
    server = make_server(served_model_name="org/drafter")
    url = server.url + "/v1/chat/completions"
    empty = call("POST", url, {"messages": []}).json()
    assert (empty["type"], empty["message"]) == ("BadRequestError", "Messages cannot be empty.")
    lora = chat(server, model="org/drafter:v2").json()
    assert lora["type"] == "BadRequestError" and lora["message"] == (
        "LoRA adapter 'v2' was requested, but LoRA is not enabled. Please launch the server "
        "with --enable-lora flag and preload adapters using --lora-paths or "
        "/load_lora_adapter endpoint."
    )
    assert chat(server, model="org/drafter").status == 200
    assert chat(server, model="anything:").status == 200  # no adapter named
    older = make_server(standin_version="v0.5.6")
    assert chat(older, model="m:a").json()["type"] == "BadRequest"


def test_a_colon_in_the_served_model_name_stops_the_server(
    tokenizer: Any, tokenizer_dir: Any
) -> None:
    from sglang_standin.cli import parse_args

    config = parse_args(["--model-path", str(tokenizer_dir), "--served-model-name", "org/m:1"])
    with pytest.raises(AssertionError) as info:
        StandinServer(config, tokenizer=tokenizer)
    assert str(info.value) == (
        "served_model_name cannot contain a colon (':') character. The colon is reserved for "
        "the 'model:adapter' syntax used in LoRA adapter specification. Invalid value: 'org/m:1'"
    )
    path_only = parse_args(["--model-path", "/models/a:b", "--tokenizer-path", str(tokenizer_dir)])
    with pytest.raises(AssertionError, match="Invalid value: '/models/a:b'"):
        StandinServer(path_only, tokenizer=tokenizer)


def test_the_sampled_log_records_what_was_sampled(make_server: ServerFactory, tmp_path) -> None:
    import json

    server = make_server(standin_sampled_log_dir=str(tmp_path), standin_noncanonical_rate=0.5)
    answers = [chat(server, q, return_token_ids=True).json()["choices"][0] for q in ("A?", "B?")]
    (log_file,) = tmp_path.glob("sampled-*.jsonl")
    lines = [json.loads(x) for x in log_file.read_text().splitlines()]
    assert [x["sampled_ids"] for x in lines] == [a["response_token_ids"] for a in answers]
    assert [x["prompt_ids"] for x in lines] == [a["prompt_token_ids"] for a in answers]
