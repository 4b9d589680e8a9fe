"""Bind a trigger conf to the deployment: refuse what a run may not choose, resolve sources.

Pure apart from reading the environment (deployment settings) and resolving local paths; the
checks that open files or buckets are in ``include/settings/validation.py``. ``run.py`` calls it
from ``RunSettings.from_mapping`` and passes the class in, so this module needs no import of
``run.py`` (no import circle).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from include.settings.deployment import DeploymentSettings, env_name, inside_data_roots
from include.settings.errors import describe, did_you_mean
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
                            "settings are listed in docs/settings.md")
        values.pop(key)
    return problems


def _is_local_path(location: str) -> bool:
    return location.startswith(("/", ".", "~")) or os.path.exists(location)


#: A Hugging Face hub id: exactly ``org/name``. Anything else (``/dir``, ``a/b/c``, ``..``)
#: is a path to ``datasets.load_dataset`` and ``from_pretrained``, which read it locally.
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}$")


def hub_id_problem(value: str, what: str) -> str | None:
    """Return why ``value`` cannot be read from the hub as ``what``, or None.

    It must be ``org/name`` and must not name something on this machine: ``load_dataset`` and
    ``from_pretrained`` load a local directory of that name (relative to the worker's current
    directory) before they look at the hub.
    """
    if not HUB_ID.match(value) or ".." in value:
        return (f"{what}: got {value!r}; accepted: a hub id 'org/name' (a local path goes in "
                "`path`, inside a data root)")
    if os.path.lexists(value) or os.path.lexists(os.path.expanduser(value)):
        return (f"{what}: {value!r} names a local file or directory of this worker, which would "
                "be read instead of the hub dataset; give a local path in `path` (inside a "
                "data root) or a hub id that names nothing here")
    return None


def _pin_hub_source(i: int, src: SourceSettings, d: DeploymentSettings
                    ) -> tuple[SourceSettings | None, str | None]:
    """Check a new hub source against the deployment's allow-list; fill a pinned revision."""
    problem = hub_id_problem(src.hub_id or "", f"setting `sources[{i}].hub_id`")
    if problem:
        return None, problem
    if not d.allowed_hub_datasets:
        return src, None
    allowed = {e.partition("@")[0]: e.partition("@")[2] or None for e in d.allowed_hub_datasets}
    if src.hub_id not in allowed:
        return None, (f"setting `sources[{i}].hub_id`: got {src.hub_id!r}; accepted: one of the "
                      f"deployment's allowed hub datasets {sorted(allowed)} (environment "
                      f"variable {env_name('allowed_hub_datasets')})")
    pinned = allowed[src.hub_id]
    if pinned and src.revision not in (None, pinned):
        return None, (f"setting `sources[{i}].revision`: got {src.revision!r}; the deployment "
                      f"pins {src.hub_id} at {pinned!r}")
    return (src.model_copy(update={"revision": pinned}) if pinned else src), None


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
                    "exclude_sources, multi_turn or turns, or choose a new name")
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
        elif src.path:
            out.append(src)
        else:
            pinned, problem = _pin_hub_source(i, src, d)
            if problem:
                problems.append(problem)
            else:
                out.append(pinned)
    return out, problems


def _check_against_deployment(run: Any, d: DeploymentSettings) -> list[str]:
    problems = []
    if run.model_path not in d.allowed_models:
        problems.append(
            f"setting `model_path`: got {run.model_path!r}; accepted: one of the deployment's "
            f"allowed models {d.allowed_models}{did_you_mean(run.model_path, d.allowed_models)} "
            f"(environment variable {env_name('allowed_models')})")
    roots = f"{d.data_roots} (environment variable {env_name('data_roots')})"
    if run.tokenizer_path:
        problems += _tokenizer_problems(run.tokenizer_path, d, roots)
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
            if not any(_under(loc, parse_location(r)) for r in d.dedupe_roots):
                problems.append(
                    f"setting `dedupe_against[{i}]`: got {location!r}; accepted: a location "
                    f"under the deployment's dedupe roots {d.dedupe_roots} (environment "
                    f"variable {env_name('dedupe_roots')}), or a local path inside the data "
                    f"roots {roots}")
        elif not inside_data_roots(str(loc), d.data_roots):
            problems.append(f"setting `dedupe_against[{i}]`: got {location!r}; accepted: a "
                            f"local path inside the data roots {roots}, or an s3:// location "
                            f"under the dedupe roots {d.dedupe_roots}")
    return problems


def _under(loc: Any, root: Any) -> bool:
    return (loc.scheme, loc.bucket) == (root.scheme, root.bucket) and (
        loc.segments[: len(root.segments)] == root.segments)


def _tokenizer_problems(value: str, d: DeploymentSettings, roots: str) -> list[str]:
    """A local tokenizer inside a data root, or a hub id the deployment allows."""
    if _is_local_path(value) or not HUB_ID.match(value):
        if inside_data_roots(os.path.expanduser(value), d.data_roots):
            return []
        return [f"setting `tokenizer_path`: got {value!r}; accepted: a local path inside the "
                f"deployment's data roots {roots}, or a hub id among the allowed models and "
                "tokenizers"]
    allowed = [*d.allowed_models, *d.allowed_tokenizers]
    if value in allowed:
        return []
    return [f"setting `tokenizer_path`: got {value!r}; accepted: one of {allowed} (environment "
            f"variables {env_name('allowed_models')}, {env_name('allowed_tokenizers')}), or a "
            f"local path inside the data roots {roots}"]


def bind_run(settings_class: type[Run], values: Mapping[str, Any] | None,
             deployment: DeploymentSettings | None = None) -> tuple[Run | None, list[str]]:
    """Return (the settings bound to ``deployment``, every problem found binding them).

    The settings are None only when the values do not make settings at all (a wrong type or
    bound); settings the deployment refuses (a model it does not allow, a path outside its
    data roots) are returned beside their problems, so that ``check_settings`` can still run
    the checks that read nothing the deployment refused (a protected ``run_name``, say) and
    report every problem at once. Such settings never leave ``check_settings``.
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
        return None, problems  # returned outside the except block: our words only in the log
    sources, source_problems = _resolve_sources(run, deployment)
    problems += source_problems + _check_against_deployment(run, deployment)
    bound = run.model_copy(update={"sources": sources})
    bound._deployment = deployment
    return bound, problems
