"""The evaluation's refusals (issue 36, item 4), as plain data in, problems out.

``request_problems`` runs before anything is launched (the DAG's check step): drafters, the
held-out split and the named prompt sets;
``server_problems`` once the servers answer, on what each reports in ``/server_info``
(``utils/common.py`` ``build_server_info``: the resolved ``speculative_*`` server args).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from include.evaluation.compat import drafter_problems
from include.evaluation.prompt_sets import load_prompt_sets
from include.evaluation.settings import EvaluationRequest
from include.evaluation.split import SplitError, load_split
from include.storage import Store


def request_problems(request: EvaluationRequest, allowed_drafters: Mapping[str, str],
                     run_store: Store, target_config: dict[str, Any] | None,
                     read_config: Callable[[str], dict[str, Any] | None], *,
                     allowed_sets: Mapping[str, str] | None = None,
                     data_roots: Sequence[str] = ()) -> list[str]:
    """Every mistake knowable before launch, all at once.

    ``allowed_drafters``, ``allowed_sets`` and ``data_roots`` are the deployment's
    (``DeploymentSettings``); each named prompt set is read whole here, as measure reads it.
    """
    problems = []
    for name in request.drafters:
        if name not in allowed_drafters:
            problems.append(f"drafter {name!r} is not one the deployment allows "
                            f"(REGEN_ALLOWED_DRAFTERS: {sorted(allowed_drafters)})")
        elif target_config is None:
            problems.append("the target's config.json cannot be read: no drafter can be "
                            "checked against it")
        else:
            path = allowed_drafters[name]
            problems += drafter_problems(name, read_config(path), target_config)
    try:
        load_split(run_store)
    except SplitError as exc:
        problems.append(str(exc))
    problems += load_prompt_sets(request.prompt_sets, allowed_sets or {}, data_roots)[1]
    return problems


def server_problems(infos: Mapping[str, dict[str, Any]], algorithm: str) -> list[str]:
    """Servers (by name) that report no speculative decoding, or another algorithm."""
    problems = []
    for name, info in sorted(infos.items()):
        got = info.get("speculative_algorithm")
        if got is None:
            problems.append(f"server {name} reports no speculative decoding "
                            "(speculative_algorithm null in /server_info): it was not launched "
                            "with --speculative-* flags, or is an older server reused")
        elif str(got).upper() != algorithm and not (algorithm == "EAGLE" and got == "NEXTN"):
            problems.append(f"server {name} runs speculative algorithm {got}, not {algorithm}")
    return problems
