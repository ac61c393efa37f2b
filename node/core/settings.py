"""The base of every room's settings object: keyword-only, validated when built, frozen, no
unknown keys; units are in the names.

Each room defines its settings once, beside the code that uses them (``node.delivery``'s
:class:`~node.delivery.DeliverySettings`, ``node.view``'s :class:`~node.view.ViewSettings` …), and
:class:`node.config.NodeConfig` inherits them: a field's type, bounds, unit and description are
written in one place, and its name is the topology file's ``[node]`` key and, through
:mod:`node.envconfig`, its ``AGENT_REACH_*`` variable.

Two users of one setting may want different defaults — the proxy's first backoff is 100 ms, the
SDK's 500 ms. The second takes the setting with :meth:`Settings.with_default`: the same field, the
same rule, another default; never a second definition of it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo

__all__ = ["Settings"]


class Settings(BaseModel):
    """Settings of one room: ``SomeSettings(name=value, …)``; a bad value raises pydantic's
    ``ValidationError`` naming the field."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def with_default(cls, name: str, default: Any) -> Any:
        """The setting ``name`` of these settings with another default, for a subclass to declare::

            class ProxySettings(DeliverySettings):
                retry_initial_backoff_ms: int = DeliverySettings.with_default("retry_initial_backoff_ms", 100)

        Raises ``TypeError`` when these settings have no field ``name``.
        """
        field = cls.model_fields.get(name)
        if field is None:
            raise TypeError(f"{cls.__name__} has no setting {name!r} (its settings: {', '.join(cls.model_fields)})")
        return FieldInfo.merge_field_infos(field, default=default)
