"""Refusals that teach: what a newcomer's first input most often gets wrong, and what to write instead.

A 422 names the field pydantic found first; for the mistakes the design's own examples make — an
expiry time in seconds where the model takes a duration or a time in milliseconds, an ``auth``
field in a registration, an agent id of two segments — the message also says which field or form
is right (:func:`hint_for`), and ``details.use`` names it. This module does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Hint", "SECONDS_NOT_MS_BELOW", "hint_for", "seconds_hint"]

# A time in ms since the epoch below this (1973-03-03) is almost surely one in seconds.
SECONDS_NOT_MS_BELOW = 100_000_000_000

_EXPIRY_NAMES = frozenset({"expire_at", "expires_at", "expire_at_s", "expires_at_s", "expiry", "expires", "expire",
                           "ttl", "ttl_s", "expires_in", "lease", "lease_ttl", "lease_ttl_s", "timeout"})
_AUTH_NAMES = frozenset({"auth", "authentication", "authorization", "token", "bearer", "api_key", "apikey",
                         "credentials", "secret", "password"})
_REGISTRATIONS = frozenset({"Registration", "CardRegistration"})
_AUTH_HINT = ("a registration carries no credentials: the node knows the agent by the bearer token of the request "
              "('Authorization: Bearer <token>', from 'agent-reach token issue --agent <agent_id>'); callers reach "
              "it with route credentials the node signs, and who may call it is allowed_callers (caller patterns)")


@dataclass(frozen=True, slots=True)
class Hint:
    """The message of a refusal that teaches, and the field or form to use instead (``use``)."""

    message: str
    use: str


def hint_for(model: str, error: Mapping[str, Any]) -> Hint | None:
    """A teaching message for pydantic's ``error`` (one item of ``ValidationError.errors()``) of a
    body parsed as ``model`` (its class name), or None when the plain message says enough."""
    location = tuple(str(part) for part in error.get("loc", ()))
    name = location[-1] if location else ""
    field = ".".join(location)
    kind = error.get("type")
    if kind == "extra_forbidden":
        return _unknown_field(model, field, name)
    if kind == "string_pattern_mismatch" and name in ("agent_id", "target_agent", "source_agent"):
        given = error.get("input")
        if isinstance(given, str):
            parts = len(given.split("."))
            return Hint(f"{field}: {given!r} has {parts} dot-separated part{'s' if parts != 1 else ''}; an agent id "
                        "has three, namespace.group.name, each of lowercase letters, digits, '_' and '-' (e.g. "
                        "payment.risk_check.prod_01)", use="namespace.group.name")
    if kind == "greater_than_equal" and name == "lease_ttl_ms" and isinstance(error.get("input"), int):
        given = error["input"]
        return Hint(f"{field}: {given} is {given} ms; lease_ttl_ms is a duration in milliseconds (at least "
                    f"{error.get('ctx', {}).get('ge')}): for {given} s give {given * 1000}", use="lease_ttl_ms")
    return None


def _unknown_field(model: str, field: str, name: str) -> Hint | None:
    if model in _REGISTRATIONS and name in _EXPIRY_NAMES:
        return Hint(f"unknown field {field!r}: a registration does not expire at a time; its lease is lease_ttl_ms, "
                    "a duration in milliseconds (e.g. 30000 for 30 s) that each heartbeat renews", use="lease_ttl_ms")
    if model in _REGISTRATIONS and name in _AUTH_NAMES:
        return Hint(f"unknown field {field!r}: {_AUTH_HINT}", use="allowed_callers")
    if model == "Envelope" and name in _EXPIRY_NAMES:
        return Hint(f"unknown field {field!r}: an envelope expires at expire_at_ms, a time in milliseconds since the "
                    "epoch (seconds × 1000)", use="expire_at_ms")
    return None


def seconds_hint(field: str, value: int) -> str | None:
    """The message for a time in ms since the epoch that is one in seconds, else None."""
    if 0 < value < SECONDS_NOT_MS_BELOW:
        return (f"{field}: {value} is a time in seconds; {field} is milliseconds since the epoch "
                f"({value} s = {value * 1000} ms)")
    return None
