"""Speculative decoding as SGLang 0.5.23 launches and reports it, with a seeded acceptance model.

Followed from SGLang 0.5.23 (paths under `python/sglang/srt/`):

- the flags: `arg_groups/fields/spec.py` `Spec` (`--speculative-algorithm`,
  `--speculative-draft-model-path` alias `--speculative-draft-model`, `--speculative-num-steps`,
  `--speculative-eagle-topk`, `--speculative-num-draft-tokens`, `--speculative-dflash-block-size`,
  `--speculative-draft-model-revision`);
- their resolution: `arg_groups/speculative_hook.py` `handle_speculative_decoding` (upper-cased;
  revision `main` when a draft path is given), `_resolve_speculative_algorithm_alias` (NEXTN and
  EAGLE are EAGLE), `spec_info.py` `SpeculativeAlgorithm.from_string` (an unknown name is a
  `ValueError`), `_handle_eagle_family` (`--max-running-requests` 48 unless given; no steps:
  `_auto_choose_speculative_params`, (5, 4, 8) for `LlamaForCausalLM` targets, else (3, 1, 4);
  top-k 1 forces draft tokens = steps + 1), `_handle_dflash` (a draft path is required; the
  block size flag is an alias of draft tokens and must agree with it; unset, the draft
  config's `dflash_config.block_size` or top-level `block_size`, else 16, `dflash_utils.py`),
  `_handle_ngram` (top-k = BFS breadth 10, draft tokens 12, steps = draft tokens - 1,
  `--max-running-requests` 48);
- what a request reports: `managers/tokenizer_manager.py` `_calculate_spec_decoding_metrics`
  (nothing unless the request had a verify pass; proposed = verify count x (draft tokens - 1);
  `spec_accept_rate` = correct / proposed, **without** the bonus token;
  `spec_accept_length` = completion tokens / verify count, **with** the bonus token and the
  prefill's first token), `managers/schedule_batch.py` `update_spec_correct_drafts_histogram`
  (index = correct drafts in one verify step), `entrypoints/openai/utils.py`
  `spec_tokens_details_from_meta_info` and `protocol.py` `SpecTokensDetails` (the nine keys,
  zeros and empty lists for what was not measured), `serving_chat.py` `_build_chat_response`
  (response-level `sglext`, one object for n = 1, a list for n > 1, absent when empty).

Where it differs on purpose: acceptance is a model, not a drafter. Each verify step proposes
D = draft tokens - 1 tokens in a chain and accepts each next one with probability `alpha`, the
drafter's fit, until the first rejection; `alpha` comes from the draft model's `config.json`
(`standin_acceptance`: `{"default": a, "rules": [{"match": [regex, ...], "rate": a}, ...]}`,
the first rule all of whose patterns occur in the templated prompt wins, so a fit can be per
domain and per thinking mode), else `DEFAULT_ALPHA`. Top-k > 1 trees and temperature are
reported but do not change acceptance. The draws come from an RNG keyed by the server seed,
the draft path, the prompt and the sampling parameters, so a request's figures are repeatable.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: `spec_info.py` `SpeculativeAlgorithm`'s builtins (NONE aside); NEXTN is a reserved alias.
ALGORITHMS = ("DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM")
#: The ones the stand-in serves; UNO and DSPARK need checkpoints and knobs it does not model.
MODELLED = frozenset({"DFLASH", "EAGLE", "EAGLE3", "STANDALONE", "NGRAM"})
#: The per-position acceptance of a drafter whose config names no fit.
DEFAULT_ALPHA = 0.5
_EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "STANDALONE", "FROZEN_KV_MTP"})
_NEEDS_DRAFT = frozenset({"DFLASH", "EAGLE", "EAGLE3", "STANDALONE"})
_SPEC_MAX_RUNNING = 48  # _handle_eagle_family / _handle_ngram
_SALT = 0x7370_6563  # this module's RNG stream, apart from the completion's


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add SGLang's speculative flags (`arg_groups/fields/spec.py`), every default None."""
    g = parser.add_argument_group("SGLang speculative decoding flags")
    g.add_argument("--speculative-algorithm", default=None)
    g.add_argument("--speculative-draft-model-path", "--speculative-draft-model",
                   dest="speculative_draft_model_path", default=None)
    g.add_argument("--speculative-draft-model-revision", default=None)
    for name in ("num-steps", "eagle-topk", "num-draft-tokens", "dflash-block-size"):
        g.add_argument(f"--speculative-{name}", type=int, default=None)


@dataclass(frozen=True)
class Fit:
    """A drafter's acceptance: per-position probability, by the first matching rule."""

    default: float
    rules: tuple[tuple[tuple[re.Pattern[str], ...], float], ...] = ()

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Fit:
        raw = config.get("standin_acceptance")
        if not isinstance(raw, dict):
            return cls(DEFAULT_ALPHA)
        rules = tuple(
            (tuple(re.compile(p) for p in rule["match"]), _alpha(rule["rate"]))
            for rule in raw.get("rules", [])
        )
        return cls(_alpha(raw.get("default", DEFAULT_ALPHA)), rules)

    def alpha(self, prompt: str) -> float:
        for patterns, rate in self.rules:
            if all(p.search(prompt) for p in patterns):
                return rate
        return self.default


def _alpha(value: Any) -> float:
    rate = float(value)
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"standin_acceptance rates must be in [0, 1), got {value!r}")
    return rate


@dataclass(frozen=True)
class SpecSettings:
    """The resolved speculative settings of one server."""

    algorithm: str
    draft_model_path: str | None
    draft_model_revision: str | None
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    fit: Fit

    def server_info(self) -> dict[str, Any]:
        """The flat `/server_info` keys (`utils/common.py` `build_server_info`: resolved args)."""
        return {
            "speculative_algorithm": self.algorithm,
            "speculative_draft_model_path": self.draft_model_path,
            "speculative_draft_model_revision": self.draft_model_revision,
            "speculative_num_steps": self.num_steps,
            "speculative_eagle_topk": self.eagle_topk,
            "speculative_num_draft_tokens": self.num_draft_tokens,
            "speculative_dflash_block_size": (
                self.num_draft_tokens if self.algorithm == "DFLASH" else None),
        }

    def details(self, *, seed: int, prompt: str, sampling: dict[str, Any],
                completion_tokens: int) -> dict[str, Any] | None:
        """Return one request's `SpecTokensDetails` JSON, or None when SGLang gives none."""
        proposed_per_step = self.num_draft_tokens - 1
        alpha = self.fit.alpha(prompt)
        key = json.dumps([seed, self.draft_model_path, prompt, sampling], sort_keys=True,
                         default=str)
        rng = random.Random(int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8)
                                           .digest(), "big") ^ _SALT)
        # The prefill samples the first token; each verify step then commits its correct
        # drafts plus one bonus token, the last step cut to what the answer still needs.
        remaining = completion_tokens - 1
        verify_ct = correct = 0
        histogram: list[int] = []
        while remaining > 0:
            k = 0
            while k < proposed_per_step and rng.random() < alpha:
                k += 1
            k = min(k, remaining - 1)
            verify_ct += 1
            correct += k
            remaining -= k + 1
            histogram += [0] * (k + 1 - len(histogram))
            histogram[k] += 1
        if verify_ct == 0 or proposed_per_step <= 0:
            return None
        proposed = verify_ct * proposed_per_step
        return {
            "spec_accept_rate": correct / proposed,
            "spec_accept_length": completion_tokens / verify_ct,
            "spec_cap_length": 0.0,
            "spec_block_accept_length": 0.0,
            "spec_num_correct_drafts": correct,
            "spec_num_proposed_drafts": proposed,
            "spec_verify_ct": verify_ct,
            "spec_correct_drafts_histogram": histogram,
            "spec_cap_lens_histogram": [],
        }

    def forward_steps(self, details: dict[str, Any] | None, completion_tokens: int) -> int:
        """Return the decode steps the performance model runs: the prefill's plus one per
        verify (a verify step is priced as one decode step, a stand-in simplification)."""
        if details is None:
            return completion_tokens
        return 1 + int(details["spec_verify_ct"])


def no_spec_server_info() -> dict[str, Any]:
    """The same keys for a server without speculative decoding (all None)."""
    return dict.fromkeys(
        ("speculative_algorithm", "speculative_draft_model_path",
         "speculative_draft_model_revision", "speculative_num_steps", "speculative_eagle_topk",
         "speculative_num_draft_tokens", "speculative_dflash_block_size"))


def resolve(raw: dict[str, Any], model_path: str) -> SpecSettings | None:
    """Resolve the flags as `speculative_hook.py` does; raise ValueError where SGLang would."""
    name = raw.get("speculative_algorithm")
    if name is None:
        return None
    upper = name.upper()
    algorithm = "EAGLE" if upper in ("NEXTN", "EAGLE") else upper
    if algorithm not in ALGORITHMS:
        raise ValueError(f"Unknown speculative algorithm name: {name}")
    if algorithm not in MODELLED:
        raise ValueError(f"stand-in: speculative algorithm {algorithm} is not modelled")
    draft = raw.get("speculative_draft_model_path")
    if algorithm in _NEEDS_DRAFT and draft is None:
        raise ValueError(
            f"{algorithm} speculative decoding requires setting --speculative-draft-model-path.")
    draft_config = _config(draft) if draft else {}
    steps, topk, tokens = (raw.get(f"speculative_{k}")
                           for k in ("num_steps", "eagle_topk", "num_draft_tokens"))
    if algorithm in _EAGLE_FAMILY:
        if steps is None:
            assert topk is None and tokens is None
            arch = (_config(model_path).get("architectures") or [""])[0]
            steps, topk, tokens = (5, 4, 8) if (
                arch == "LlamaForCausalLM" and algorithm != "STANDALONE") else (3, 1, 4)
        if topk == 1 and tokens != steps + 1:
            tokens = steps + 1
    elif algorithm == "DFLASH":
        block = raw.get("speculative_dflash_block_size")
        if block is not None and tokens is not None and tokens != block:
            raise ValueError(
                "--speculative-dflash-block-size must equal --speculative-num-draft-tokens "
                f"when both are set: speculative_num_draft_tokens={tokens}, "
                f"speculative_dflash_block_size={block}.")
        inferred = (draft_config.get("dflash_config") or {}).get(
            "block_size", draft_config.get("block_size"))
        tokens = block or tokens or inferred or 16
        steps, topk = tokens - 1, 1
    else:  # NGRAM
        tokens = tokens or 12
        steps, topk = tokens - 1, topk or 10
    revision = raw.get("speculative_draft_model_revision") or ("main" if draft else None)
    return SpecSettings(algorithm, draft, revision, int(steps), int(topk), int(tokens),
                        Fit.from_config(draft_config))


def max_running_default(spec: SpecSettings | None) -> int | None:
    """`--max-running-requests` when not given: 48 under speculative decoding."""
    return None if spec is None else _SPEC_MAX_RUNNING


def _config(path: str) -> dict[str, Any]:
    file = Path(path) / "config.json"
    if not file.is_file():
        return {}
    data = json.loads(file.read_text())
    return data if isinstance(data, dict) else {}
