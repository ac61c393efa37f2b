"""What calls ask of their route and their delivery: :class:`CallOptions`, one frozen object a
caller builds once and passes to ``call()``, ``resolve()`` and ``send()`` as often as it likes.

Its fields come in three groups, each checked when the options are built by the model the fields
end up in, so each rule is written once:

* **routing**, which agent may answer — ``version``, ``labels``, ``scope``, ``preferred_region``,
  ``semantic``, ``conversation_id``: fields of the :class:`~node.core.models.RouteRequest`.
  ``conversation_id`` is here, not with the envelope, because routing is what it changes: the
  node keeps a conversation's calls on one agent, and the SDK then calls the ticket's target
  instead of drawing among its alternates;
* **delivery**, how hard to try — ``idempotent``, ``timeout_ms``, ``connect_timeout_ms``,
  ``read_timeout_ms``, ``max_attempts``: the client's :class:`~node.delivery.DeliverySettings`
  (``request_timeout_ms`` is ``timeout_ms`` here) for these calls only;
* **envelope**, what the envelope ``call()`` builds carries — ``operation``, ``trace_id``,
  ``extensions``: fields of the :class:`~node.core.Envelope`. A prepared envelope
  (``call(envelope=...)``) is sent as it is.

A method uses the options that concern it and leaves the others (``resolve()`` delivers nothing);
a routing preference it cannot honour is refused, never dropped, since dropping it would change
who answers (``send()``: the node's proxy routes by ``version`` and ``scope`` only). This module
does no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ..core import Envelope, ValidationFailed, first_problem
from ..core.models import RouteRequest, Scope
from ..delivery import DeliverySettings

ROUTING_OPTIONS = ("version", "labels", "scope", "preferred_region", "semantic", "conversation_id")
# each delivery option and the DeliverySettings field it stands for in these calls
DELIVERY_OPTIONS = {"timeout_ms": "request_timeout_ms", "connect_timeout_ms": "connect_timeout_ms",
                    "read_timeout_ms": "read_timeout_ms", "max_attempts": "max_attempts"}
ENVELOPE_OPTIONS = ("operation", "trace_id", "extensions")
RESOLVE_OPTIONS = frozenset({*ROUTING_OPTIONS, "trace_id"})  # the decision joins the trace
PROXY_ROUTING = ("version", "scope")  # what POST /v1/send takes beside the envelope
# RouteRequest wants a selector; the real one is call()'s or resolve()'s, this one only lets the check run
_ANY_SELECTOR = {"capability": "options.check"}

Delivery = TypeVar("Delivery", bound=DeliverySettings)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CallOptions:
    """How calls are routed and delivered; ``None`` leaves a setting to the client's
    (:class:`ClientSettings`: ``semantic``, ``request_timeout_ms`` …)::

        options = CallOptions(version=">=2", scope="local", idempotent=True, timeout_ms=5_000)
        await reach.call("translate.text", payload, options=options)
        ticket = await reach.resolve("translate.text", options=options)   # the same route, the same cached ticket

    Validated when built: a bad value raises :class:`ValidationFailed` naming the field. Frozen
    (``labels`` and ``extensions`` are read-only mappings); :meth:`replace` returns a checked copy.
    ``scope`` may be given as its text (``"local"``) and is kept as a :class:`Scope`.
    ``idempotent`` marks the calls safe to repeat: they are retried, up to ``max_attempts``
    (else the client's), within ``timeout_ms``; a call is retried when its keyword, its options or
    its envelope says so.
    """

    # routing: which agent may answer
    version: str | None = None
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    scope: Scope | str | None = None
    preferred_region: str | None = None
    semantic: bool | None = None
    conversation_id: str | None = None
    # delivery: how hard to try
    idempotent: bool = False
    timeout_ms: int | None = None
    connect_timeout_ms: int | None = None
    read_timeout_ms: int | None = None
    max_attempts: int | None = None
    # envelope: what an envelope built by call() carries
    operation: str | None = None
    trace_id: str | None = None
    extensions: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.idempotent, bool):
            raise ValidationFailed("call option idempotent: give True or False", field="idempotent")
        checked = {**_checked_routing(self), **_checked_delivery(self), **_checked_envelope(self)}
        for name in ("labels", "extensions"):  # a read-only copy: the caller's dict may change later
            value = checked.get(name) or getattr(self, name) or {}
            if not isinstance(value, MappingProxyType):
                checked[name] = MappingProxyType(dict(value))
        for name, value in checked.items():  # the checked value, as its model holds it (a Scope, an int)
            object.__setattr__(self, name, value)

    def replace(self, **changes: Any) -> CallOptions:
        """These options with ``changes`` (field names) on top, checked again; raises ValidationFailed."""
        unknown = sorted(changes.keys() - OPTION_NAMES)
        if unknown:
            raise ValidationFailed(f"there is no call option {unknown[0]!r} (the options: {', '.join(OPTION_NAMES)})",
                                   field=unknown[0])
        return dataclasses.replace(self, **changes)

    def route_request(self, *, client_semantic: bool, **request: Any) -> RouteRequest:
        """The route request for ``request`` (selectors ``capability``, ``agent_id``, ``pattern``,
        ``tags``; ``exclude``, ``trace_id``, and a ``conversation_id`` that replaces these options'),
        routed by these options. ``client_semantic`` is the client's setting, for options that leave
        ``semantic`` open. Raises ValidationFailed naming the field."""
        fields: dict[str, Any] = {name: getattr(self, name) for name in ROUTING_OPTIONS}
        fields["labels"] = dict(self.labels) or None  # none given: not sent (an older node refuses what it lacks)
        fields["semantic"] = client_semantic if self.semantic is None else self.semantic
        return route_request(**{**fields, **request})

    def delivery_settings(self, settings: Delivery) -> Delivery:
        """``settings`` (the client's) with these options' timeouts and attempts on top."""
        update = {field: value for option, field in DELIVERY_OPTIONS.items()
                  if (value := getattr(self, option)) is not None}
        return settings.model_copy(update=update) if update else settings  # checked when these options were built

    def proxy_query(self) -> dict[str, str]:
        """The ``POST /v1/send`` query of these options' routing.

        Raises ValidationFailed for a routing preference the node's proxy does not take (it routes
        by version and scope only): sent without it, the envelope could reach an agent it excludes.
        Delivery and envelope options are the node's and the envelope's in proxy mode, not used.
        """
        refused = [name for name in ("labels", "preferred_region", "conversation_id") if getattr(self, name)]
        if self.semantic is False:  # the proxy's routing may always fall back on the semantic match
            refused.append("semantic")
        if refused:
            raise ValidationFailed(f"send() cannot route by {', '.join(refused)}: the node's proxy routes by "
                                   f"{' and '.join(PROXY_ROUTING)} only (call() takes every option; a conversation "
                                   "goes in the envelope's extensions['conversation_id'])", field=refused[0])
        query = {"version": self.version} if self.version else {}
        if self.scope is not None:
            query["scope"] = Scope(self.scope).value
        return query


OPTION_NAMES = tuple(field.name for field in dataclasses.fields(CallOptions))


def options_for(method: str, options: CallOptions | None, overrides: Mapping[str, Any], *,
                takes: Collection[str] = OPTION_NAMES) -> CallOptions:
    """What ``method`` runs with: ``options`` (none: the client's settings) with the keyword
    ``overrides`` it was given on top, checked once here; a keyword given ``None`` leaves the
    options' value (a wrapper may pass its own defaults on). ``takes`` names the keywords it
    accepts; raises ValidationFailed for another one or for a bad value."""
    if options is None:
        options = NO_OPTIONS
    elif not isinstance(options, CallOptions):
        raise ValidationFailed(f"{method}(options=...) takes a CallOptions, not {type(options).__name__}",
                               field="options")
    if not overrides:
        return options
    refused = sorted(overrides.keys() - set(takes))
    if refused:
        raise ValidationFailed(f"{method}() takes no option {refused[0]!r} (its options: "
                               f"{', '.join(name for name in OPTION_NAMES if name in takes)})", field=refused[0])
    changes = {name: value for name, value in overrides.items() if value is not None}
    return options.replace(**changes) if changes else options


def route_request(**fields: Any) -> RouteRequest:
    """A :class:`RouteRequest` of the fields given (None: left out); raises ValidationFailed naming the field."""
    data = {name: value for name, value in fields.items() if value is not None}
    if "labels" in data:
        data["labels"] = dict(data["labels"])
    return _validated(RouteRequest, data, what="route request")


def _checked_routing(options: CallOptions) -> dict[str, Any]:
    given = {name: value for name in ROUTING_OPTIONS if (value := getattr(options, name)) is not None}
    if not given.get("labels", True):  # the default, nothing to check
        del given["labels"]
    if not given:
        return {}
    request = _validated(RouteRequest, {**_ANY_SELECTOR, **given}, what="call option")
    return {name: getattr(request, name) for name in given}


def _checked_delivery(options: CallOptions) -> dict[str, Any]:
    given = {field: value for option, field in DELIVERY_OPTIONS.items()
             if (value := getattr(options, option)) is not None}
    if not given:
        return {}
    settings = _validated(DeliverySettings, given, what="call option",
                          names={field: option for option, field in DELIVERY_OPTIONS.items()})
    return {option: getattr(settings, field) for option, field in DELIVERY_OPTIONS.items() if field in given}


def _checked_envelope(options: CallOptions) -> dict[str, Any]:
    given = {name: value for name in ENVELOPE_OPTIONS if (value := getattr(options, name)) is not None}
    if not given.get("extensions", True):
        del given["extensions"]
    if not given:
        return {}
    envelope = _validated(Envelope, given, what="call option")
    return {name: getattr(envelope, name) for name in given}


_Model = TypeVar("_Model", bound=BaseModel)


def _validated(model: type[_Model], data: Mapping[str, Any], *, what: str,
               names: Mapping[str, str] | None = None) -> _Model:
    """``model`` of ``data``, or ValidationFailed naming the field (as ``names`` calls it: the option's name)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = first_problem(exc)
        head, *rest = first.location or ("",)
        field = ".".join([(names or {}).get(str(head), str(head)), *map(str, rest)]) or None
        raise ValidationFailed(f"{what} {field or ''}: {first.message}", field=field) from exc


NO_OPTIONS = CallOptions()  # a call given none: every setting the client's

__all__ = ["DELIVERY_OPTIONS", "ENVELOPE_OPTIONS", "NO_OPTIONS", "OPTION_NAMES", "RESOLVE_OPTIONS", "ROUTING_OPTIONS",
           "CallOptions", "options_for", "route_request"]
