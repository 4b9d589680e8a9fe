"""``prepare_prompts``: prepare or reuse the run's prompt shards; plan the shards to run.

The prompts stage (``include.prompts.plan``) prepares or reuses the shards and picks those
left; this task adds what belongs to the run: where its outputs go, that Airflow can map that
many shards, and the staggered start of the first shards in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from include.layout import (
    EVAL_PROMPTS_KEY,
    EVAL_SHARD,
    Split,
    eval_key,
    eval_location,
    shard_index,
    tokenized_keys,
)
from include.pipeline.airflow_state import max_map_length
from include.pipeline.binding import (
    bind,
    fail_without_retry,
    open_outputs_store,
    open_run_store,
    outputs_uri,
)
from include.prompts.plan import PERMANENT_ERRORS, prepare_or_reuse, select_shards
from include.settings import RunSettings, SettingsError

log = logging.getLogger(__name__)


def check_map_length(settings: RunSettings, todo: list[str], total: int,
                     limit: int | None = None) -> None:
    """Refuse, before any server starts, a run mapping more shards than Airflow allows.

    The message says exactly what to do: run the shards in parts with ``shard_range`` (the
    prompt shards are prepared once and reused), or raise the deployment's limit.
    """
    limit = max_map_length() if limit is None else limit
    if len(todo) <= limit:
        return
    first, last = shard_index(todo[0]), shard_index(todo[-1])
    parts = [f"'{lo}-{min(lo + limit, last + 1) - 1}'" for lo in range(first, last + 1, limit)]
    raise SettingsError(
        f"setting `shard_range` ({settings.shard_range or 'all'}): this run would generate "
        f"{len(todo)} of the {total} shards, more than Airflow maps one task over here "
        f"(core.max_map_length = {limit}). The prompts are prepared and kept; run the shards "
        f"in parts with shard_range {', then '.join(parts[:3])}{' ...' if len(parts) > 3 else ''}"
        f" (same run_name), or ask whoever deploys to set AIRFLOW__CORE__MAX_MAP_LENGTH to at "
        f"least {len(todo)} on the scheduler and workers")


def stagger(shard_ids: list[str], shards_in_flight: int) -> list[dict[str, Any] | None]:
    """Return, per shard, the progress of the first shard it waits for before starting.

    Shards in flight share the servers equally, so shards that start together also drain
    together, and the GPUs idle at every such boundary. The first wave therefore starts
    staggered: shard ``p`` (``0 < p < shards_in_flight``) waits until the first shard has
    finished ``p / shards_in_flight`` of its prompts. Later shards start as earlier ones
    finish, so the offsets persist and each drain overlaps the others' steady work.
    """
    first = shard_ids[0] if shard_ids else None
    return [
        {"shard_id": first, "fraction": round(p / shards_in_flight, 4)}
        if 0 < p < shards_in_flight
        else None
        for p in range(len(shard_ids))
    ]


#: The XCom key under which ``prepare_prompts`` says a run has nothing to do; the listener of
#: ``plugins/regen_notes.py`` makes it the run's note when the run ends.
NOTHING_TO_DO_KEY = "nothing_to_do"


def held_out_pending(settings: RunSettings, manifest: Mapping[str, Any], outputs: Any) -> bool:
    """Return whether the run's held-out split is still to be answered by the target.

    Only a whole run answers it (no ``shard_range``: a backfill generates its range and no
    more); a run without a split (``held_out_per_source`` 0, or prepared before splits were
    answered) has none to answer. Answered means tokenized, as for a shard: its tokenized
    manifest in the outputs' ``eval/``.
    """
    held = manifest.get("held_out") or {}
    if settings.shard_range or not held.get("count") or held.get("key") != EVAL_PROMPTS_KEY:
        return False
    return not outputs.exists(eval_key(tokenized_keys(shard_index(EVAL_SHARD))[2]))


def nothing_to_do(settings: RunSettings, plan: Mapping[str, Any]) -> str | None:
    """Return the sentence saying this run has no shard to generate, or None when it has.

    ``plan`` is ``select_shards``' answer. Said where a person looks (the check_settings and
    prepare_prompts logs, the run's note, the monitor): a green run that skipped everything
    after ``launch_servers`` otherwise looks like one that did the work.
    """
    if plan["shards"]:
        return None
    done = len(plan["complete"])  # nothing left: every selected shard with prompts is done
    scope = f" (shard_range {settings.shard_range})" if settings.shard_range else ""
    if not done:
        return (f"nothing to do: the selected shards{scope} of run_name {settings.run_name!r} "
                "hold no prompts; choose other shards with shard_range, or a new run_name")
    return (f"nothing to do: {done} of {done} shard{'s' * (done != 1)}{scope} already complete "
            f"under run_name {settings.run_name!r} ({settings.run_uri}); to make a new run, "
            "trigger with a new "
            "run_name, or with force_regenerate: true to generate these shards again in a new "
            "folder")


def plan_run(settings: RunSettings, run_id: str, shards_in_flight: int = 1,
             say: Any = None) -> list[dict[str, Any]]:
    """Prepare or reuse the prompt shards; return what the per-shard task group maps over.

    One ``{"shard_id", "outputs_uri", "wait_for", "split"}`` per shard to run (``wait_for``:
    see ``stagger``), and last, while the target has not answered it, the held-out split
    (``split`` ``held_out``: the shard ``EVAL_SHARD`` of the run's ``eval/`` folder). With
    nothing to run, the reason is logged and passed to ``say``.
    """
    run_store = open_run_store(settings)
    manifest = prepare_or_reuse(settings, run_store)
    outputs = outputs_uri(settings, run_id)
    outputs_store = open_outputs_store(settings, run_id, run_store)
    plan = select_shards(settings, manifest, outputs_store)
    check_map_length(settings, plan["shards"], plan["total_shards"])
    log.info("outputs of this run go to %s", outputs)
    held_out = held_out_pending(settings, manifest, outputs_store)
    if held_out and len(plan["shards"]) >= max_map_length():
        log.warning("the held-out split is left unanswered: this run maps %d shards, Airflow's "
                    "limit; a run of the rest answers it", len(plan["shards"]))
        held_out = False
    idle = None if held_out else nothing_to_do(settings, plan)
    if idle:
        log.warning("%s", idle)
        if say is not None:
            say(idle)
    waits = stagger(plan["shards"], shards_in_flight)
    entries = [{"shard_id": sid, "outputs_uri": outputs, "wait_for": wait,
                "split": Split.TRAIN.value}
               for sid, wait in zip(plan["shards"], waits, strict=True)]
    if held_out:
        log.info("the held-out split (%s) is answered too, in %s", run_store.uri(
            EVAL_PROMPTS_KEY), eval_location(outputs))
        entries.append({"shard_id": EVAL_SHARD, "outputs_uri": outputs, "wait_for": None,
                        "split": Split.HELD_OUT.value})
    return entries


def run(params: Mapping[str, Any] | None, run_id: str | None,
        shards_in_flight: int) -> list[dict[str, Any]]:
    """The prepare_prompts task: the plan, or a failure without retry on a permanent error."""
    with fail_without_retry(*PERMANENT_ERRORS):
        return plan_run(bind(params), run_id or "manual", shards_in_flight, _tell_the_run)


def _tell_the_run(sentence: str) -> None:
    """Leave ``sentence`` for the run's note (a task cannot set its run's note itself)."""
    from airflow.sdk import get_current_context

    get_current_context()["ti"].xcom_push(NOTHING_TO_DO_KEY, sentence)
