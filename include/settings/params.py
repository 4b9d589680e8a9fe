"""The trigger form and the settings reference, generated from the run model's JSON schema.

One source of truth: titles, descriptions, sections, bounds, choices and patterns are declared
once on ``RunSettings``; the form, the validation and the README table all come from there.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from include.settings.deployment import DeploymentSettings, env_name
from include.settings.run import RunSettings, SourceSettings

#: JSON-schema keywords the Airflow trigger form understands (the rest is pydantic's own).
_FORM_KEYS = ("type", "minimum", "maximum", "enum", "pattern", "items", "properties",
              "additionalProperties", "required", "minLength", "maxLength", "examples")


def _inline(schema: Any, defs: dict[str, Any]) -> Any:
    """Replace ``$ref``s by their definitions: each Param carries a self-contained schema."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            # The field's own keys (title, description, section, default) sit beside the ref.
            siblings = {k: v for k, v in schema.items() if k != "$ref"}
            return _inline({**defs[schema["$ref"].rsplit("/", 1)[-1]], **siblings}, defs)
        return {k: _inline(v, defs) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_inline(v, defs) for v in schema]
    return schema


def _nullable(prop: dict[str, Any]) -> dict[str, Any]:
    """Fold pydantic's ``anyOf: [X, null]`` into ``X`` with ``type: [X, "null"]``."""
    variants = prop.get("anyOf")
    if not variants:
        return prop
    inner = [v for v in variants if v.get("type") != "null"]
    if len(inner) != 1 or len(inner) == len(variants):
        return prop
    out = {k: v for k, v in prop.items() if k != "anyOf"}
    out.update(inner[0])
    out["type"] = [inner[0]["type"], "null"]
    return out


def form_schemas() -> dict[str, dict[str, Any]]:
    """Return, per run setting, its JSON schema with title, description and section."""
    full = RunSettings.model_json_schema()
    defs = full.get("$defs", {})
    out = {}
    for name, prop in full["properties"].items():
        prop = _nullable(_inline(copy.deepcopy(prop), defs))
        if "items" in prop:
            prop["items"] = {k: v for k, v in prop["items"].items()
                             if k not in ("title", "description")}
            for p in prop["items"].get("properties", {}).values():
                p.update(_nullable(p))
                p.pop("anyOf", None)
        out[name] = prop
    return out


def _optional_in_form(schema: dict[str, Any]) -> None:
    """Let a field be emptied: every run setting has a default, and null means "the default".

    Airflow's form marks a field whose type does not admit null as required; none is.
    """
    kind = schema.get("type")
    if kind == "boolean" or (isinstance(kind, list) and "null" in kind):
        return  # a switch is never empty; already optional
    schema["type"] = [kind, "null"]
    if "enum" in schema:
        schema["enum"] = [*schema["enum"], None]


def deployment_defaults() -> dict[str, Any]:
    """Return the run settings whose default comes from the deployment (environment only, as
    parsing must be): the first allowed model, so the form's defaults are a run it accepts."""
    return {"model_path": DeploymentSettings.parse_time_values().allowed_models[0]}


#: What the settings reference says of the defaults ``deployment_defaults`` fills in.
_DEPLOYMENT_DEFAULT_TEXT = {"model_path": f"the first of `{env_name('allowed_models')}`"}


def airflow_params() -> dict[str, Any]:
    """Return the DAG's trigger form: one typed ``Param`` per run setting.

    Deployment settings are not in the form: a run cannot choose hosts, commands, credentials
    or protected locations; the defaults of ``deployment_defaults`` come from them.
    """
    from airflow.sdk import Param

    params: dict[str, Any] = {}
    deployed = deployment_defaults()
    for name, prop in form_schemas().items():
        schema = {k: prop[k] for k in _FORM_KEYS if k in prop}
        _optional_in_form(schema)
        description = prop["description"] + _bounds_out_of_the_field(schema)
        params[name] = Param(deployed.get(name, prop.get("default")), title=prop["title"],
                             description=description, section=prop["section"], **schema)
    return params


def _bounds_out_of_the_field(schema: dict[str, Any]) -> str:
    """Move a number's bounds where the form's field cannot clamp to them; say them instead.

    Airflow's number field takes ``minimum``/``maximum`` as its input's bounds and, when it
    loses focus, silently replaces a value outside them by the nearest bound (``shard_size``
    0 became 1, issue 34). Under ``allOf`` the trigger still refuses such a value, saying why
    ("0 is less than the minimum of 1"), and the field keeps what the person typed.
    """
    bounds = {k: schema.pop(k) for k in ("minimum", "maximum") if k in schema}
    if not bounds:
        return ""
    schema["allOf"] = [bounds]
    low, high = bounds.get("minimum"), bounds.get("maximum")
    said = (f"{low} to {high}" if low is not None and high is not None
            else f"at least {low}" if low is not None else f"at most {high}")
    return f" Accepted: {said}."


def _cell(value: Any) -> str:
    return f"`{json.dumps(value)}`"


def _choices(prop: dict[str, Any]) -> str:
    enum = prop.get("enum") or (prop.get("items") or {}).get("enum")
    return f" One of {', '.join(f'`{c}`' for c in enum)}." if enum else ""


def settings_reference() -> str:
    """Return the Markdown reference of run and deployment settings (README's generated part)."""
    lines: list[str] = []
    section = None
    for name, prop in form_schemas().items():
        if prop["section"] != section:
            section = prop["section"]
            lines += ["", f"**{section}**", "", "| setting | default | meaning |", "|---|---|---|"]
        default = ("the whole catalogue" if name == "sources" else
                   _DEPLOYMENT_DEFAULT_TEXT.get(name) or _cell(prop.get("default")))
        lines.append(f"| `{name}` | {default} | {prop['description']}{_choices(prop)} |")
    lines += ["", "**Keys of a `sources` entry**", "", "| key | default | meaning |",
              "|---|---|---|"]
    for name, field in SourceSettings.model_fields.items():
        default = "required" if field.is_required() else _cell(field.default)
        prop = SourceSettings.model_json_schema()["properties"][name]
        lines.append(f"| `{name}` | {default} | {field.description}{_choices(_nullable(prop))} |")
    lines += ["", "**Deployment settings** (environment variables, not in the form)", "",
              "| environment variable | default | meaning |", "|---|---|---|"]
    for name, field in DeploymentSettings.model_fields.items():
        default = {"output_root": "`var/runs` (local)", "data_roots": "`include/sample_data`",
                   "source_catalogue": "the bundled samples"}.get(name)
        if default is None:
            value = field.default_factory() if field.default_factory else field.default
            default = _cell(json.loads(json.dumps(value, default=lambda m: m.model_dump())))
        lines.append(f"| `{env_name(name)}` | {default} | {field.description} |")
    return "\n".join(lines).strip() + "\n"
