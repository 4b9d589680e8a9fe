"""What every task does first: bind the run's settings, open its stores, fail for good.

The run's settings are rebuilt in each task from the run's params and the deployment settings
of the worker's environment (never from XCom); ``bind`` is the one place that happens.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from include.layout import Split, eval_location, regeneration_prefix
from include.pipeline.refusal import refuse
from include.settings import RunSettings, SettingsError
from include.storage import Store, StoreError, normalize_location, open_store


def bind(params: Mapping[str, Any] | None) -> RunSettings:
    """Return the run's settings from its params and the environment's deployment settings."""
    return RunSettings.from_mapping(params)


def lease_owner(dag_id: str, run_id: str | None) -> str:
    """Return the name of a run's lease on its servers, from its run id (never from XCom)."""
    return f"{dag_id}/{run_id}"


def outputs_uri(settings: RunSettings, run_id: str) -> str:
    """Return where this run writes journals, completions and tokenized shards: the run's own
    location, or with ``force_regenerate`` a fresh folder named after the Airflow run id."""
    if not settings.force_regenerate:
        return settings.run_uri
    return f"{settings.run_uri}/{regeneration_prefix(run_id)}"


def trusted_outputs_uri(settings: RunSettings, run_id: str | None, given: Any) -> str:
    """Return this run's output location, rebuilt from its settings and run id.

    ``given`` is the plan entry's ``outputs_uri`` (XCom, which can be edited): it is only
    compared, never opened, and any other location is refused (XComMismatchError, before a
    byte is written), as server identifiers are (``servers.launch_report.trusted_spec``).
    """
    from include.servers.launch_report import XComMismatchError

    expected = outputs_uri(settings, run_id or "manual")
    try:
        same = isinstance(given, str) and normalize_location(given) == normalize_location(
            expected)
    except StoreError:
        same = False
    if not same:
        shown = repr(given) if len(repr(given)) <= 200 else repr(given)[:200] + "...'"
        raise XComMismatchError(
            f"outputs_uri {shown} in XCom is not this run's output location {expected!r}: "
            "XCom did not match the deployment; refusing it before anything is written (the "
            "location is rebuilt from deployment setting `output_root`, the run's `run_name` "
            "and `force_regenerate` and the Airflow run id, never taken from XCom). If the "
            "plan was edited, clear prepare_prompts and its downstream tasks to plan again")
    return expected


def open_run_store(settings: RunSettings, uri: str | None = None) -> Store:
    """Return the store at ``uri`` (default: the run's location), protected prefixes enforced."""
    return open_store(
        uri or settings.run_uri,
        s3_conn_id=settings.deployment.s3_conn_id,
        protected_prefixes=tuple(settings.deployment.protected_prefixes),
    )


def open_outputs_store(settings: RunSettings, run_id: str, run_store: Store) -> Store:
    """Return the store of this run's outputs (``run_store`` itself at the run's own location,
    so its location and credentials lines are logged once, not twice: issue 34)."""
    outputs = outputs_uri(settings, run_id)
    return run_store if outputs == settings.run_uri else open_run_store(settings, outputs)


@contextmanager
def fail_without_retry(*errors: type[BaseException]) -> Iterator[None]:
    """Turn ``errors`` (and SettingsError) into a refusal (``include.pipeline.refusal``): a
    mistake in the settings or the data fails the same on every try, so none is retried."""
    try:
        yield
    except (SettingsError, *errors) as exc:
        refuse(str(exc))


def shard_locations(settings: RunSettings, outputs: str, split: Any) -> tuple[str, str]:
    """Return the (outputs, prompts) locations of a plan entry's shard.

    A training shard's are the run's outputs location and the run's own; the held-out split's
    are their ``eval/`` folders (``include.layout.EVAL_PREFIX``). ``split`` comes from XCom:
    any other value is refused (XComMismatchError), it only ever picks one of the two.
    """
    from include.servers.launch_report import XComMismatchError

    if split not in (Split.TRAIN, Split.HELD_OUT):
        raise XComMismatchError(
            f"split {str(split)[:40]!r} in XCom is none of {[s.value for s in Split]}: XCom "
            "was edited; clear prepare_prompts and its downstream tasks to plan again")
    if split == Split.HELD_OUT:
        return eval_location(outputs), eval_location(settings.run_uri)
    return outputs, settings.run_uri


def shard_stores(settings: RunSettings, outputs: str, split: Any) -> tuple[Store, Store]:
    """Return the (outputs, prompts) stores of a plan entry's shard (``shard_locations``)."""
    outputs, prompts = shard_locations(settings, outputs, split)
    outputs_store = open_run_store(settings, outputs)
    # One store for one location: each opening logs its location and its credentials' source.
    same = outputs.rstrip("/") == prompts.rstrip("/")
    return outputs_store, (outputs_store if same else open_run_store(settings, prompts))
