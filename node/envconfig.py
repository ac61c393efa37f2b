"""Node settings from the environment: every :class:`NodeConfig` field as ``AGENT_REACH_<FIELD>``.

The names are derived from the model, so a new setting is configurable from the environment the
day it is added: ``ticket_ttl_ms`` is ``AGENT_REACH_TICKET_TTL_MS``; a field of a nested settings
model takes its parent's name as a prefix (``proxy.max_hops`` is ``AGENT_REACH_PROXY_MAX_HOPS``,
``egress.allow`` is ``AGENT_REACH_EGRESS_ALLOW``). :func:`env_settings` lists them all (the
generated table in ``docs/configuration.md``).

Values are read as the model reads them (``"5000"`` is an int, ``true``/``false``/``1``/``0`` a
bool); a list is comma-separated (``loopback,10.1.0.0/16``) or a JSON array; an empty variable
counts as unset. A value a setting refuses is an :class:`EnvConfigError` naming the variable.

Precedence, applied by the ``agent-reach node`` command: flags > environment > topology file >
defaults. Other ``AGENT_REACH_*`` variables (``AGENT_REACH_SECRET``, ``AGENT_REACH_URL`` …) are
not node settings and are left alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from .config import NodeConfig
from .core import first_problem
from .trust import mask_credentials

__all__ = ["ENV_PREFIX", "EnvConfigError", "EnvSetting", "PER_NODE_SETTINGS", "env_settings", "env_table",
           "merge_settings", "settings_from_env", "variable_of", "without_per_node_settings"]

ENV_PREFIX = "AGENT_REACH_"
# What names one node, not a deployment: a launcher of several nodes (``agent-reach up``) does
# not hand these down from its own environment, or every region would take the same value.
PER_NODE_SETTINGS = ("region", "redis_url", "host", "port", "node_id", "advertise_url", "signing_key_file")


class EnvConfigError(ValueError):
    """An ``AGENT_REACH_*`` variable holds a value its setting refuses; the message names it."""


@dataclass(frozen=True, slots=True)
class EnvSetting:
    """One node setting as an environment variable."""

    variable: str
    path: tuple[str, ...]  # ("proxy", "max_hops")
    field: FieldInfo

    @property
    def setting(self) -> str:
        return ".".join(self.path)

    def parse(self, raw: str) -> Any:
        """The value of ``raw`` for this setting; raises :class:`EnvConfigError` naming the variable."""
        value: Any = raw
        if _is_sequence(self.field.annotation):
            value = _sequence(self.variable, raw)
        try:
            return _adapter(self)(value)
        except ValidationError as exc:
            shown = raw if self.path[-1] not in _SECRET_FIELDS else "…"
            raise EnvConfigError(f"{self.variable}={mask_credentials(shown)!r}: "
                                 f"{first_problem(exc).text}") from None


_SECRET_FIELDS = frozenset({"redis_url"})  # may carry a password: never echoed back


@cache
def env_settings() -> tuple[EnvSetting, ...]:
    """Every node setting as a variable, in the model's field order (nested models expanded)."""
    found: list[EnvSetting] = []
    for name, field in NodeConfig.model_fields.items():
        nested = _model_of(field.annotation)
        if nested is None:
            found.append(EnvSetting(f"{ENV_PREFIX}{name.upper()}", (name,), field))
            continue
        for inner, inner_field in nested.model_fields.items():
            found.append(EnvSetting(f"{ENV_PREFIX}{name.upper()}_{inner.upper()}", (name, inner), inner_field))
    variables = [setting.variable for setting in found]
    if len(set(variables)) != len(variables):  # a nested field spelled like a top-level one
        raise RuntimeError(f"two node settings share an environment variable: {sorted(variables)}")
    return tuple(found)


def variable_of(path: tuple[str | int, ...]) -> str | None:
    """The variable of a setting's path (as pydantic's error locations give it), if it has one."""
    for setting in env_settings():
        if tuple(path[:len(setting.path)]) == setting.path:
            return setting.variable
    return None


def settings_from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """The node settings ``environ`` sets, nested like NodeConfig's keywords (``{"proxy": {"max_hops": 4}}``).

    Raises :class:`EnvConfigError` for the first variable whose value its setting refuses.
    """
    settings: dict[str, Any] = {}
    for setting in env_settings():
        raw = environ.get(setting.variable)
        if raw is None or raw.strip() == "":
            continue
        value = setting.parse(raw.strip())
        target = settings
        for part in setting.path[:-1]:
            target = target.setdefault(part, {})
        target[setting.path[-1]] = value
    return settings


def without_per_node_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the variables of :data:`PER_NODE_SETTINGS`."""
    dropped = {f"{ENV_PREFIX}{name.upper()}" for name in PER_NODE_SETTINGS}
    return {key: value for key, value in environ.items() if key not in dropped}


def merge_settings(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` on top; a nested settings model is merged key by key."""
    merged = dict(base)
    for key, value in overrides.items():
        current = merged.get(key)
        if isinstance(value, dict) and isinstance(current, (dict, BaseModel)):
            current = current.model_dump() if isinstance(current, BaseModel) else current
            merged[key] = {**current, **value}
        else:
            merged[key] = value
    return merged


def env_table() -> str:
    """The Markdown table of every variable: setting, default and description."""
    rows = ["| variable | setting | default | meaning |", "|---|---|---|---|"]
    for setting in env_settings():
        field = setting.field
        if field.is_required():
            default = "(required)"
        elif field.default_factory is not None:
            default = f"`{_shown(field.default_factory())}`"  # type: ignore[call-arg]
        else:
            default = f"`{_shown(field.default)}`"
        description = (field.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{setting.variable}` | `{setting.setting}` | {default} | {description} |")
    return "\n".join(rows) + "\n"


# -- internals -------------------------------------------------------------------------------

def _shown(value: Any) -> str:
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, tuple):
        return json.dumps(list(value))
    return str(value)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _is_sequence(annotation: Any) -> bool:
    candidates = get_args(annotation) if get_origin(annotation) is not None and get_origin(annotation) not in (
        list, tuple) else (annotation,)
    return any(get_origin(candidate) in (list, tuple) for candidate in candidates)


def _sequence(variable: str, raw: str) -> list[Any]:
    if raw.startswith("["):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise EnvConfigError(f"{variable}: not a JSON array ({exc.msg}); or give a comma-separated list") from None
        if not isinstance(value, list):
            raise EnvConfigError(f"{variable}: a JSON array or a comma-separated list")
        return value
    return [item.strip() for item in raw.split(",") if item.strip()]


_ADAPTERS: dict[str, Callable[[Any], Any]] = {}


def _adapter(setting: EnvSetting) -> Callable[[Any], Any]:
    """The setting's own validation (its type and constraints), built once per variable."""
    adapter = _ADAPTERS.get(setting.variable)
    if adapter is None:
        adapter = _ADAPTERS[setting.variable] = TypeAdapter(
            Annotated[setting.field.annotation, setting.field]).validate_python
    return adapter


if __name__ == "__main__":  # python -m node.envconfig: the table of docs/configuration.md
    print(env_table(), end="")
