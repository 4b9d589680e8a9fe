"""Speculative decoding as SGLang 0.5.23 launches it and reports it per request (speculative.py).

The acceptance figures follow `tokenizer_manager.py` `_calculate_spec_decoding_metrics`; the
fit is the stand-in's seeded model (a per-position acceptance named in the draft config).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sglang_standin import speculative
from sglang_standin.speculative import Fit, SpecSettings, resolve
from sglang_standin.testing import ThreadServer, call, chat

ServerFactory = Callable[..., ThreadServer]
#: protocol.py SpecTokensDetails, in its field order.
DETAIL_KEYS = [
    "spec_accept_rate", "spec_accept_length", "spec_cap_length", "spec_block_accept_length",
    "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_verify_ct",
    "spec_correct_drafts_histogram", "spec_cap_lens_histogram",
]


def drafter(root: Path, name: str, default: float, rules: list[dict] | None = None,
            **config: Any) -> str:
    """Write a draft model directory whose config.json names a fit; return its path."""
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    fit = {"default": default, "rules": rules or []}
    (path / "config.json").write_text(json.dumps({"standin_acceptance": fit, **config}))
    return str(path)


def expected_rate(alpha: float, proposed: int) -> float:
    """E[correct drafts per step] / D for a chain accepting each next draft with `alpha`."""
    return sum(alpha**i for i in range(1, proposed + 1)) / proposed


def raw(**flags: Any) -> dict[str, Any]:
    keys = ("algorithm", "draft_model_path", "draft_model_revision", "num_steps", "eagle_topk",
            "num_draft_tokens", "dflash_block_size")
    return {f"speculative_{k}": flags.get(k) for k in keys}


def test_flags_resolve_as_speculative_hook_does(tmp_path: Path) -> None:
    d = drafter(tmp_path, "d", 0.5)
    auto = resolve(raw(algorithm="eagle3", draft_model_path=d), str(tmp_path))
    assert auto is not None
    assert (auto.algorithm, auto.num_steps, auto.eagle_topk, auto.num_draft_tokens) == (
        "EAGLE3", 3, 1, 4)
    assert auto.draft_model_revision == "main"
    # top-k 1: draft tokens forced to steps + 1.
    chain = resolve(raw(algorithm="EAGLE", draft_model_path=d, num_steps=5, eagle_topk=1,
                        num_draft_tokens=16), str(tmp_path))
    assert chain is not None and chain.num_draft_tokens == 6
    nextn = resolve(raw(algorithm="NEXTN", draft_model_path=d), str(tmp_path))
    assert nextn is not None and nextn.algorithm == "EAGLE"
    target = tmp_path / "llama"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    llama = resolve(raw(algorithm="EAGLE", draft_model_path=d), str(target))
    assert llama is not None and (llama.num_steps, llama.eagle_topk, llama.num_draft_tokens) == (
        5, 4, 8)
    ngram = resolve(raw(algorithm="NGRAM"), str(tmp_path))
    assert ngram is not None and (ngram.num_draft_tokens, ngram.num_steps) == (12, 11)
    assert resolve(raw(), str(tmp_path)) is None


def test_dflash_block_size_comes_from_the_flag_or_the_draft_config(tmp_path: Path) -> None:
    d = drafter(tmp_path, "df", 0.6, dflash_config={"block_size": 10})
    from_config = resolve(raw(algorithm="DFLASH", draft_model_path=d), str(tmp_path))
    assert from_config is not None and from_config.num_draft_tokens == 10
    flag = resolve(raw(algorithm="DFLASH", draft_model_path=d, dflash_block_size=8),
                   str(tmp_path))
    assert flag is not None and flag.num_draft_tokens == 8
    plain = resolve(raw(algorithm="DFLASH", draft_model_path=drafter(tmp_path, "p", 0.6)),
                    str(tmp_path))
    assert plain is not None and plain.num_draft_tokens == 16
    with pytest.raises(ValueError, match="must equal --speculative-num-draft-tokens"):
        resolve(raw(algorithm="DFLASH", draft_model_path=d, dflash_block_size=8,
                    num_draft_tokens=4), str(tmp_path))


@pytest.mark.parametrize(("flags", "message"), [
    ({"algorithm": "MEDUSA"}, "Unknown speculative algorithm name: MEDUSA"),
    ({"algorithm": "DFLASH"}, "DFLASH speculative decoding requires setting "
                              "--speculative-draft-model-path."),
    ({"algorithm": "UNO"}, "not modelled"),
])
def test_flags_sglang_refuses_end_start_up(tmp_path: Path, flags: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve(raw(**flags), str(tmp_path))


def test_details_add_up_as_the_tokenizer_manager_computes_them() -> None:
    spec = SpecSettings("EAGLE3", "/d", "main", 3, 1, 4, Fit(0.7))
    for n in (2, 5, 37, 400):
        d = spec.details(seed=1, prompt=f"p{n}", sampling={}, completion_tokens=n)
        assert d is not None and list(d) == DETAIL_KEYS
        verify, correct = d["spec_verify_ct"], d["spec_num_correct_drafts"]
        # Prefill gives the first token; each verify its correct drafts plus the bonus.
        assert n == 1 + verify + correct
        assert d["spec_num_proposed_drafts"] == verify * 3
        assert d["spec_accept_rate"] == correct / (verify * 3)
        assert d["spec_accept_length"] == n / verify  # the bonus token counts
        hist = d["spec_correct_drafts_histogram"]
        assert sum(hist) == verify and sum(i * h for i, h in enumerate(hist)) == correct
        assert len(hist) <= 4
    # One token: no verify pass, so SGLang reports nothing (verify_ct > 0 is required).
    assert spec.details(seed=1, prompt="p", sampling={}, completion_tokens=1) is None


def test_acceptance_follows_the_fit_per_rule() -> None:
    fit = Fit(0.3, (((re.compile("math"),), 0.8),))
    spec = SpecSettings("EAGLE3", "/d", "main", 4, 1, 5, fit)
    for prompt, alpha in (("a math question", 0.8), ("a poem", 0.3)):
        correct = proposed = 0
        for i in range(300):
            d = spec.details(seed=0, prompt=f"{prompt} {i}", sampling={}, completion_tokens=200)
            assert d is not None
            correct += d["spec_num_correct_drafts"]
            proposed += d["spec_num_proposed_drafts"]
        assert correct / proposed == pytest.approx(expected_rate(alpha, 4), abs=0.02)


def test_chat_returns_sglext_spec_tokens_details_only_when_asked(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    d = drafter(tmp_path, "eagle", 0.6)
    server = make_server(speculative_algorithm="EAGLE3", speculative_draft_model_path=d)
    body = chat(server, "Why?", return_spec_tokens_details=True).json()
    details = body["sglext"]["spec_tokens_details"]
    assert list(body)[-1] == "sglext" and list(details) == DETAIL_KEYS
    n = body["usage"]["completion_tokens"]
    assert details["spec_accept_length"] == n / details["spec_verify_ct"]
    assert "sglext" not in chat(server, "Why?").json()
    two = chat(server, "Why?", n=2, return_spec_tokens_details=True).json()
    assert isinstance(two["sglext"]["spec_tokens_details"], list)
    assert len(two["sglext"]["spec_tokens_details"]) == 2
    # Same prompt, same sampling: the same figures (a seeded model).
    again = chat(server, "Why?", return_spec_tokens_details=True).json()
    assert again["sglext"]["spec_tokens_details"] == details


def test_server_info_reports_the_resolved_speculative_settings(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    d = drafter(tmp_path, "eagle", 0.6)
    spec = make_server(speculative_algorithm="eagle3", speculative_draft_model_path=d,
                       speculative_num_steps=2, speculative_eagle_topk=1)
    info = call("GET", f"{spec.url}/server_info").json()
    assert info["speculative_algorithm"] == "EAGLE3"
    assert (info["speculative_num_steps"], info["speculative_num_draft_tokens"]) == (2, 3)
    assert info["speculative_draft_model_path"] == d
    assert info["max_running_requests"] == 48
    plain = make_server()
    plain_info = call("GET", f"{plain.url}/server_info").json()
    assert plain_info["speculative_algorithm"] is None
    assert set(speculative.no_spec_server_info()) <= set(plain_info)
    # Asked of a server without speculative decoding: no meta_info keys, so no sglext.
    assert "sglext" not in chat(plain, "Why?", return_spec_tokens_details=True).json()


def test_speculation_shortens_the_modelled_decode(tmp_path: Path) -> None:
    spec = SpecSettings("EAGLE3", "/d", "main", 3, 1, 4, Fit(0.8))
    d = spec.details(seed=0, prompt="x", sampling={}, completion_tokens=300)
    steps = spec.forward_steps(d, 300)
    assert d is not None and steps == 1 + d["spec_verify_ct"] < 300
    assert spec.forward_steps(None, 300) == 300
