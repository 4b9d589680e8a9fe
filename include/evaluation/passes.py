"""Which servers measure which drafter configuration: a pure plan, rebuilt in every task.

An evaluation measures each drafter (the baseline, the candidates) and, for the speedup, the
target alone. Every configuration gets its own servers, the deployment's split among them in
settings order (the issue's "split across servers"), so all passes run at once and none
reuses another's server; their speculative flags differ, so the launcher would refuse to.
The plan is a function of the form and the deployment alone: a task rebuilds it from both,
so XCom only names a configuration, never a server, path or flag.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from include.evaluation.records import TARGET_ONLY
from include.evaluation.settings import EvaluationRequest
from include.servers.commands import ServerSpec
from include.servers.expectations import SpeculativeLaunch


class PassPlanError(ValueError):
    """The deployment has too few servers for the evaluation's configurations."""


@dataclass(frozen=True)
class Pass:
    """One drafter configuration (or the target alone) and the servers that measure it."""

    config: str
    speculative: SpeculativeLaunch | None
    servers: tuple[ServerSpec, ...]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]


def configurations(request: EvaluationRequest) -> list[str]:
    """The configurations measured, in report order: the drafters, then the target alone."""
    return [*request.drafters, *([TARGET_ONLY] if request.target_only_pass else [])]


def plan_passes(request: EvaluationRequest, allowed_drafters: Mapping[str, str],
                specs: Sequence[ServerSpec]) -> list[Pass]:
    """Split ``specs`` among the configurations, contiguous and as even as can be.

    Raise PassPlanError when there are fewer servers than configurations, and KeyError for a
    drafter the deployment does not allow (the check step refuses both first).
    """
    configs = configurations(request)
    if len(specs) < len(configs):
        raise PassPlanError(
            f"{len(configs)} configurations to measure ({', '.join(configs)}) need as many "
            f"servers, one set each; the deployment has {len(specs)} (gpu_hosts at this "
            "tp_size): drop a candidate, turn target_only_pass off, or list more GPUs")
    size, extra = divmod(len(specs), len(configs))
    passes, start = [], 0
    for i, config in enumerate(configs):
        end = start + size + (1 if i < extra else 0)
        spec = (None if config == TARGET_ONLY
                else request.speculative(allowed_drafters[config]))
        passes.append(Pass(config, spec, tuple(specs[start:end])))
        start = end
    return passes


def pass_named(passes: Sequence[Pass], config: object) -> Pass:
    """The pass of ``config`` (a name from XCom: only compared); KeyError if none."""
    for p in passes:
        if p.config == config:
            return p
    raise KeyError(f"configuration {config!r} (from XCom) is not one this evaluation measures "
                   f"({[p.config for p in passes]})")


def pass_serving(passes: Sequence[Pass], spec: ServerSpec) -> Pass:
    """The pass whose servers include ``spec`` (the health gate's expectation)."""
    for p in passes:
        if any((s.host, s.port) == (spec.host, spec.port) for s in p.servers):
            return p
    raise KeyError(f"server {spec.address} measures no configuration of this evaluation")
