"""Decide whether a running server serves what a run needs, and whether a run may launch.

Pure functions over JSON and a few numbers, shared by the launcher (reuse or replace?), the
health trigger (gate) and ``check_settings``. ``/v1/models`` is the only place SGLang shows its
effective context length (``max_model_len``), so that is what is compared; its entries are read
by ``include.sglang.contract``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

from include.sglang.contract import served_models


class Expectation(Protocol):
    """What a served model must match; ``RunSettings`` and ``ModelExpectation`` both fit."""

    @property
    def model_name(self) -> str: ...

    context_length: int
    context_margin: int
    min_completion_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class SpeculativeLaunch:
    """SGLang's speculative flags for one launch (``arg_groups/fields/spec.py``).

    ``draft_model_path`` comes from the deployment (``allowed_drafters``), never a form; the
    numbers are typed. None: the flag is not given (SGLang chooses, ``speculative_hook.py``).
    """

    algorithm: str
    draft_model_path: str | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None

    def flags(self) -> list[str]:
        """The launch flags (appended after the deployment's ``extra_server_args``)."""
        out = ["--speculative-algorithm", self.algorithm]
        if self.draft_model_path is not None:
            out += ["--speculative-draft-model-path", self.draft_model_path]
        for name in ("num_steps", "eagle_topk", "num_draft_tokens"):
            value = getattr(self, name)
            if value is not None:
                out += [f"--speculative-{name.replace('_', '-')}", str(int(value))]
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def speculative_differences(info: Any, wanted: SpeculativeLaunch | None) -> list[str]:
    """How a server's ``/server_info`` differs from the speculation a launch wants ([]: same).

    SGLang reports its resolved server args there (``utils/common.py`` ``build_server_info``):
    ``speculative_algorithm`` is null without speculation. ``info`` None means it could not be
    read: a difference only when speculation is wanted (a server that cannot say is never
    taken for a drafter's; one of a release without the endpoint does not speculate here).
    Only the flags the launch gives are compared (SGLang resolves the others itself).
    """
    if info is None or not isinstance(info, dict):
        if wanted is None:
            return []
        return ["/server_info cannot be read: whether it runs the drafter "
                f"{wanted.draft_model_path} cannot be told"]
    got = info.get("speculative_algorithm")
    if wanted is None:
        return [] if got is None else [
            f"speculates ({got}, draft {info.get('speculative_draft_model_path')}) but this run "
            "wants the target alone (no --speculative-* flags)"]
    if got is None:
        return [f"does not speculate but this run wants {wanted.algorithm} with draft "
                f"{wanted.draft_model_path}"]
    same_algorithm = str(got).upper() == wanted.algorithm.upper() or (
        {str(got).upper(), wanted.algorithm.upper()} == {"EAGLE", "NEXTN"})
    out = [] if same_algorithm else [
        f"speculative_algorithm {got}, this run wants {wanted.algorithm}"]
    for name in ("draft_model_path", "num_steps", "eagle_topk", "num_draft_tokens"):
        value, served = getattr(wanted, name), info.get(f"speculative_{name}")
        if value is not None and served != value:
            out.append(f"speculative_{name} {served!r}, this run wants {value!r}")
    return out


@dataclass(frozen=True)
class ModelExpectation:
    """Hold the settings a server is checked against, as JSON-ready data for XCom/triggers."""

    model_name: str
    context_length: int
    context_margin: int = 16
    min_completion_tokens: int = 256
    max_tokens: int = 8192
    #: The speculation the servers must run; None: the target alone (the main DAG's servers).
    speculative: SpeculativeLaunch | None = None

    @classmethod
    def from_settings(cls, settings: Expectation) -> ModelExpectation:
        """Take the checked fields from ``RunSettings`` (or any object with them)."""
        return cls(
            model_name=settings.model_name,
            context_length=settings.context_length,
            context_margin=settings.context_margin,
            min_completion_tokens=settings.min_completion_tokens,
            max_tokens=settings.max_tokens,
        )

    def to_dict(self) -> dict[str, Any]:
        """Return JSON-ready data; ``from_dict`` inverts it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelExpectation:
        """Build from ``to_dict`` output."""
        values = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        if values.get("speculative") is not None:
            values["speculative"] = SpeculativeLaunch(**values["speculative"])
        return cls(**values)


def served_model_differences(models_json: Any, expected: Expectation) -> list[str]:
    """Return how the served model differs from the run's (name, context length); [] if none.

    These are the differences a relaunch fixes; each message names the setting and the fix.
    """
    models = served_models(models_json)
    if not models:
        return [f"/v1/models lists no model (answer: {str(models_json)[:200]!r})"]
    name = expected.model_name
    match = next((m for m in models if m.get("id") == name), None)
    if match is None:
        ids = [m.get("id") for m in models]
        return [
            f"serves model {ids} but this run expects {name!r} (setting `served_model_name`, "
            f"else `model_path`); relaunch it (set `replace_mismatched_servers`: true) or change "
            "the setting to the served name"
        ]
    length = match.get("max_model_len")
    if length != expected.context_length:
        return [
            f"reports max_model_len {length} but setting `context_length` is "
            f"{expected.context_length}; relaunch it with --context-length "
            f"{expected.context_length} (set `replace_mismatched_servers`: true) or set "
            f"`context_length` to {length}"
        ]
    return []


def budget_line(expected: Expectation) -> str:
    """Return the one line saying how long completions may be in a run (for its log).

    Each request asks for ``min(max_tokens, C - P - margin)`` tokens, so any ``max_tokens``,
    even one at or above the context length, is safe; a prompt that leaves fewer than
    ``min_completion_tokens`` is skipped, never sent (the rule of ``BudgetRule.budget``).
    """
    c, m, margin = expected.context_length, expected.max_tokens, expected.context_margin
    least = expected.min_completion_tokens
    return (
        f"completions are bounded by min(max_tokens={m}, {c} - P - {margin}) tokens per prompt "
        f"of P tokens; prompts leaving fewer than min_completion_tokens={least} are skipped "
        f"(P > {c - margin - least})"
    )


def key_problems(deployment: Any, api_key: str | None) -> list[str]:
    """Return why the servers cannot be launched with this API key; [] if they can.

    A server on a non-loopback host listens on the network, so it must have a key. The key
    must also reach SGLang intact: its ``--config`` file turns it into ``--api-key KEY``, which
    argparse reads as a flag when it starts with ``-``, and clients send it in an HTTP header,
    which cannot hold whitespace or control characters. ``deployment`` is the
    ``DeploymentSettings`` (``gpu_hosts``, ``sglang_conn_id``).
    """
    from include.settings.deployment import env_name

    conn = deployment.sglang_conn_id
    where = f"the password of Airflow connection {conn!r} ({env_name('sglang_conn_id')})"
    remote = [h.host for h in deployment.gpu_hosts if not h.is_loopback]
    problems: list[str] = []
    if remote and not api_key:
        problems.append(
            f"deployment setting `gpu_hosts` ({env_name('gpu_hosts')}): servers on "
            f"{', '.join(remote)} listen on the network but there is no API key: {where} is "
            "missing or empty; create that connection with the key as its password (e.g. "
            f"AIRFLOW_CONN_{conn.upper()}='{{\"conn_type\": \"generic\", \"password\": "
            f"\"...\"}}'), point {env_name('sglang_conn_id')} at one that has it, or list only "
            "loopback hosts"
        )
    if api_key and api_key.startswith("-"):
        problems.append(
            f"the servers' API key ({where}) starts with '-': SGLang would read it as a "
            "flag; use a key that starts with a letter or digit"
        )
    if api_key and any(ch.isspace() or not ch.isprintable() for ch in api_key):
        problems.append(
            f"the servers' API key ({where}) contains whitespace or control characters, "
            "which an HTTP Authorization header cannot carry; use printable characters only"
        )
    return problems
