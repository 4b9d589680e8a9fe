"""``measure[config]``: one configuration's servers answer the held-out split, journaled.

The deployment's named prompt sets the form picked (``prompt_sets``) go out after the split,
read from the files ``allowed_prompt_sets`` names, into the same journal.

The servers are the pass's own, rebuilt from the params and the deployment (XCom names the
configuration only, and the dataset run, a run name); before a request each must report the
pass's speculation in ``/server_info`` (a target-only server none), the refusal of issue 36's
"servers that report no speculative support". Every request is journaled under
``<dataset run>/eval/evaluations/<run id>/journal/<config>/`` (durability's StoreJournal), so a
retry sends only what is missing; a retryable failure left over fails the try, and Airflow's
retry resumes it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from include.pipeline.binding import fail_without_retry


class ServersRefused(ValueError):
    """A pass's servers do not run its speculation (or the XCom names no configuration)."""


def run(config: Any, dataset_run: Any, params: Mapping[str, Any] | None,
        run_id: str | None) -> dict[str, Any]:
    """The measure task of one configuration; returns its counts and time."""
    from include.durability.journal import StoreJournal, is_final
    from include.evaluation.binding import bind_evaluation, dataset_uri
    from include.evaluation.keys import journal_prefix
    from include.evaluation.measure import run_pass
    from include.evaluation.passes import pass_named
    from include.evaluation.prompt_sets import PromptSetError, named_sets
    from include.evaluation.records import Condition
    from include.evaluation.split import load_split
    from include.servers.expectations import speculative_differences
    from include.servers.launcher import probe_server_info
    from include.sglang.contract import bearer
    from include.storage import open_store

    request, settings, passes = bind_evaluation(params)
    deployment = settings.deployment
    with fail_without_retry(ServersRefused, KeyError, ValueError):
        p = pass_named(passes, config)
        uri = dataset_uri(deployment, dataset_run)
        key = settings.api_key
        wrong = [f"{url}: {d}" for url in p.urls
                 for d in speculative_differences(probe_server_info(url, key), p.speculative)]
        if wrong:
            raise ServersRefused(f"{p.config}: servers that do not run this pass's "
                                 "speculation:\n- " + "\n- ".join(wrong))
    store = open_store(uri, s3_conn_id=deployment.s3_conn_id,
                       protected_prefixes=tuple(deployment.protected_prefixes))
    split = load_split(store)
    with fail_without_retry(PromptSetError):  # the check step read them; a file changed since
        sets = named_sets(request.prompt_sets, deployment.allowed_prompt_sets,
                          deployment.data_roots)
    # The split, then each named set: one journal, ids apart (a set's are ``set:<name>/...``).
    prompts = split.prompts + [p for s in sets for p in s.prompts]
    journal = StoreJournal(store, journal_prefix(run_id or "manual", p.config))
    counts: Counter[str] = Counter()
    start = time.monotonic()
    try:
        for temperature in request.temperatures:
            for thinking in request.thinking_modes:
                cond = Condition(p.config, temperature, thinking)
                counts += run_pass(p.urls, prompts, cond, journal,
                                   model=settings.model_name, max_tokens=request.max_tokens,
                                   headers=bearer(key),
                                   concurrency=request.concurrency * len(p.urls))
    finally:
        journal.close()
    elapsed = time.monotonic() - start
    left = [k for k, r in journal.load().items() if not is_final(r)]
    print(f"{p.config}: {dict(counts)} over {len(p.urls)} server(s) in {elapsed:.1f} s "
          f"({len(split.prompts)} held-out prompts"
          + "".join(f" + {len(s.prompts)} of set {s.name}" for s in sets)
          + f" x {len(request.temperatures)} temperature(s)"
          f" x {len(request.thinking_modes)} thinking mode(s))")
    if left:  # retryable failures: Airflow's retry sends only these again
        raise RuntimeError(f"{p.config}: {len(left)} requests ended on a retryable failure "
                           f"(e.g. {left[0]}); a retry sends only those")
    return {"config": p.config, "counts": dict(counts), "seconds": round(elapsed, 2)}
