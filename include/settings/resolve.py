"""Bind a trigger conf to the deployment: refuse what a run may not choose, resolve sources.

Pure apart from reading the environment (deployment settings) and resolving local paths; the
checks that open files or buckets are in ``include/settings/checks.py``. ``run.py`` calls it
from ``RunSettings.from_mapping`` and passes the class in, so this module needs no import of
``run.py`` (no import circle).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from include.settings.deployment import DeploymentSettings, env_name, inside_data_roots
from include.settings.errors import describe, did_you_mean, raise_all
from include.settings.fields import PATTERN_ACCEPTED, SourceSettings

#: ``RunSettings``, which is passed in (``run.py`` imports this module).
Run = TypeVar("Run", bound=BaseModel)

#: Names that earlier versions took as run settings, and the deployment setting now owning them.
MOVED_TO_DEPLOYMENT = {"output_uri": "output_root", "api_key": "sglang_conn_id"}


def _refuse_foreign_keys(
    values: dict[str, Any], deployment: DeploymentSettings, run_fields: Mapping[str, Any]
) -> list[str]:
    problems = []
    for key in list(values):
        if key in run_fields:
            continue
        owner = MOVED_TO_DEPLOYMENT.get(key, key)
        if deployment.is_deployment_setting(owner):
            what = ("the servers' API key is the password of an Airflow connection, named by "
                    f"{env_name(owner)}" if key == "api_key"
                    else f"it is configured by whoever deploys (environment variable "
                    f"{env_name(owner)})")
            problems.append(f"`{key}` is a deployment setting, not a run setting: {what}; "
                            "remove it from the run's conf")
        else:
            problems.append(f"unknown setting `{key}`{did_you_mean(key, run_fields)}; the run "
                            "settings are listed in README.md (Settings reference)")
        values.pop(key)
    return problems


def _is_local_path(location: str) -> bool:
    return location.startswith(("/", ".", "~")) or os.path.exists(location)


def _resolve_sources(
    run: Any, d: DeploymentSettings
) -> tuple[list[SourceSettings], list[str]]:
    if not run.sources:  # null or [] (an emptied form field): the whole catalogue
        return list(d.source_catalogue.values()), []
    out: list[SourceSettings] = []
    problems: list[str] = []
    roots = f"{d.data_roots} (environment variable {env_name('data_roots')})"
    for i, src in enumerate(run.sources):
        given = src.model_dump(exclude_unset=True)
        entry = d.source_catalogue.get(src.name)
        if entry is not None:
            moved = sorted(k for k in SourceSettings.LOCATION_KEYS
                           if k in given and given[k] != getattr(entry, k))
            if moved:
                problems.append(
                    f"setting `sources[{i}]` ({src.name}): {moved} given for a source of the "
                    f"deployment's catalogue, whose location is configured there (environment "
                    f"variable {env_name('source_catalogue')}); give only quota, languages, "
                    "exclude_sources or multi_turn, or choose a new name")
                continue
            out.append(entry.model_copy(update={
                k: v for k, v in given.items()
                if k not in SourceSettings.LOCATION_KEYS and k != "name"}))
        elif not (src.path or src.hub_id):
            hint = did_you_mean(src.name, d.source_catalogue)
            problems.append(
                f"setting `sources[{i}]`: {src.name!r} is not in the deployment's source "
                f"catalogue {sorted(d.source_catalogue)}{hint}; accepted: a catalogue name, or a "
                "new name with `hub_id` or `path`")
        elif src.path and not inside_data_roots(os.path.expanduser(src.path), d.data_roots):
            problems.append(f"setting `sources[{i}].path`: got {src.path!r}; accepted: a path "
                            f"inside the deployment's data roots {roots}")
        else:
            out.append(src)
    return out, problems


def _check_against_deployment(run: Any, d: DeploymentSettings) -> list[str]:
    problems = []
    if run.model_path not in d.allowed_models:
        problems.append(
            f"setting `model_path`: got {run.model_path!r}; accepted: one of the deployment's "
            f"allowed models {d.allowed_models}{did_you_mean(run.model_path, d.allowed_models)} "
            f"(environment variable {env_name('allowed_models')})")
    roots = f"{d.data_roots} (environment variable {env_name('data_roots')})"
    if run.tokenizer_path and _is_local_path(run.tokenizer_path) and not inside_data_roots(
            os.path.expanduser(run.tokenizer_path), d.data_roots):
        problems.append(f"setting `tokenizer_path`: got {run.tokenizer_path!r}; accepted: a hub "
                        f"id, or a local path inside the deployment's data roots {roots}")
    from include.storage.errors import StoreError
    from include.storage.locations import parse_location

    for i, location in enumerate(run.dedupe_against):
        try:
            loc = parse_location(location, what=f"setting `dedupe_against[{i}]`")
        except StoreError as exc:
            problems.append(f"{exc}; accepted: s3://bucket/key or a local path inside the "
                            "data roots")
            continue
        if loc.scheme == "s3":
            continue
        if not inside_data_roots(str(loc), d.data_roots):
            problems.append(f"setting `dedupe_against[{i}]`: got {location!r}; accepted: an "
                            f"s3:// location or a local path inside the data roots {roots}")
    return problems


def resolve_run(settings_class: type[Run], values: Mapping[str, Any] | None,
                deployment: DeploymentSettings | None = None) -> Run:
    """Return ``settings_class`` (RunSettings) of ``values`` bound to ``deployment``.

    Raise SettingsError naming every problem at once.
    """
    if deployment is None:
        deployment = DeploymentSettings.load()
        deployment.check()
    values = dict(values or {})
    problems = _refuse_foreign_keys(values, deployment, settings_class.model_fields)
    values = {k: v for k, v in values.items() if v is not None}
    try:
        run = settings_class.model_validate(values)
    except ValidationError as exc:
        problems += describe(exc, known=settings_class.model_fields,
                             accepted_patterns=PATTERN_ACCEPTED)
        run = None
    if run is None:  # raised outside the except block: the log shows our words only
        raise_all(problems)
        raise AssertionError("unreachable: a validation error always names a problem")
    sources, source_problems = _resolve_sources(run, deployment)
    raise_all(problems + source_problems + _check_against_deployment(run, deployment))
    bound = run.model_copy(update={"sources": sources})
    bound._deployment = deployment
    return bound
