"""The region's payload policy for proxy mode: envelopes that carry secrets are refused, and what
the node records of an envelope's extensions has secret-looking values masked.

* **Refusal.** An envelope whose payload or extensions hold a key the region lists
  (``proxy.refused_payload_keys``; default ``password``, ``secret``, ``private_key``, compared
  without case, ``-`` read as ``_``) at any depth is refused with a 422 ``payload_refused`` naming
  where (``payload.user.password``), before anything is delivered. A ``passthrough`` target (a
  legacy agent that takes the raw payload) is exempt unless ``proxy.payload_policy_passthrough``
  says otherwise: such an agent's API may need those fields. The proxy judges a send once it knows
  its target; a callback send, answered before routing, is judged by the local agents it may reach
  (:meth:`PayloadPolicy.refusal`), and by its target again when it is routed.
* **Masking.** :func:`mask_secrets` keeps the last 4 characters of a value whose key looks like a
  secret's (``api_key``, ``token``, ``authorization``, ``password`` …) or that looks like one
  itself (a JWT, ``Bearer …``, a well-known key prefix, a long run of key-like characters):
  ``"sk-live-0123456789abcdef"`` is recorded as ``"****cdef"``. It is applied to what the node
  records of a proxied envelope's extensions (trace events, the decision log), never to what it
  delivers.

This module does no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..core import ValidationFailed
from ..core.models import MAX_JSON_DEPTH

__all__ = ["DEFAULT_REFUSED_PAYLOAD_KEYS", "MASK", "PayloadPolicy", "PayloadRefused", "mask_secrets", "secret_key"]

DEFAULT_REFUSED_PAYLOAD_KEYS = ("password", "secret", "private_key")
MASK = "****"
_KEPT = 4
# A key names a secret when one of its words is one of these, or it holds one of the fragments
# (camelCase keys are read lower-cased whole: "accessToken" holds "token").
_SECRET_WORDS = frozenset({"auth", "authorization", "bearer", "cookie", "credential", "credentials", "jwt", "key",
                           "otp", "pin", "signature", "apikey"})
_SECRET_FRAGMENTS = ("password", "passwd", "passphrase", "secret", "token", "api_key", "apikey", "private_key",
                     "access_key", "session_key")
_SECRET_VALUE_RE = re.compile(
    r"^(bearer|basic)\s+\S+"                                   # an Authorization header's value
    r"|^ey[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*$"  # a JWT
    r"|^(sk|pk|rk)[-_](live|test)?[-_]?[A-Za-z0-9]{8,}"        # API keys of the common payment/LLM kind
    r"|^(ghp|gho|ghs|github_pat|xox[abpr]|glpat)[-_][A-Za-z0-9_-]{8,}"
    r"|^AKIA[0-9A-Z]{16}$"
    r"|^(?=[A-Za-z0-9+/_=-]*[0-9])(?=[A-Za-z0-9+/_=-]*[A-Za-z])[A-Za-z0-9+/_=-]{32,}$",  # a long key-like run
    re.IGNORECASE)


class PayloadRefused(ValidationFailed):
    """The region's payload policy refuses an envelope carrying a secret's key."""

    code = "payload_refused"


def _normal(key: str) -> str:
    return key.strip().casefold().replace("-", "_")


def secret_key(key: str) -> bool:
    """Whether a key's name says its value is a secret (``api_key``, ``accessToken``, ``Authorization``)."""
    normal = _normal(key)
    return any(fragment in normal for fragment in _SECRET_FRAGMENTS) or not _SECRET_WORDS.isdisjoint(
        re.split(r"[^a-z0-9]+", normal))


def _masked(value: str) -> str:
    return MASK + value[-_KEPT:] if len(value) > 2 * _KEPT else MASK


def mask_secrets(value: object, *, secret: bool = False, depth: int = 0) -> object:
    """A copy of ``value`` (free-form JSON) with every secret-looking string kept to its last 4
    characters (``secret``: the value sits under a secret's key, so anything in it is masked)."""
    if depth > MAX_JSON_DEPTH:
        return MASK
    if isinstance(value, dict):
        return {key: mask_secrets(item, secret=secret or secret_key(str(key)), depth=depth + 1)
                for key, item in value.items()}
    if isinstance(value, list):
        return [mask_secrets(item, secret=secret, depth=depth + 1) for item in value]
    if isinstance(value, str):
        return _masked(value) if secret or _SECRET_VALUE_RE.search(value) else value
    return MASK if secret and value is not None else value


class PayloadPolicy:
    """Which keys a region refuses in proxied envelopes, and whether passthrough targets are held to it."""

    def __init__(self, *, refused_keys: Iterable[str] = DEFAULT_REFUSED_PAYLOAD_KEYS, passthrough: bool = False,
                 region: str = "") -> None:
        self.refused_keys = frozenset(_normal(key) for key in refused_keys)
        self.passthrough = passthrough
        self.region = region

    def applies_to(self, transport: str | None) -> bool:
        """Whether an envelope to a target of ``transport`` is held to the policy."""
        return bool(self.refused_keys) and (self.passthrough or transport != "passthrough")

    def refusal(self, payload: object, extensions: dict[str, object], transports: list[str]) -> PayloadRefused | None:
        """Why a send that may reach targets of ``transports`` is refused (None: it is not, or one
        of them is exempt, or there are none to judge by)."""
        if not transports or not all(self.applies_to(transport) for transport in transports):
            return None
        try:
            self.check(payload, extensions)
        except PayloadRefused as refused:
            return refused
        return None

    def check(self, payload: object, extensions: dict[str, object]) -> None:
        """Raises :class:`PayloadRefused` naming the first refused key in ``payload`` or ``extensions``."""
        if not self.refused_keys:
            return
        for root, value in (("payload", payload), ("extensions", extensions)):
            where = self._refused_at(value, root, 0)
            if where is not None:
                key = where.rpartition(".")[2]
                raise PayloadRefused(
                    f"{where}: region {self.region} refuses envelopes carrying {key!r} (its payload policy: "
                    f"{', '.join(sorted(self.refused_keys))}); send a reference to the secret (where the agent "
                    "finds it), never the secret", field=where)

    def _refused_at(self, value: object, path: str, depth: int) -> str | None:
        if depth > MAX_JSON_DEPTH:
            return None
        if isinstance(value, dict):
            for key, item in value.items():
                here = f"{path}.{key}"
                if _normal(str(key)) in self.refused_keys:
                    return here
                found = self._refused_at(item, here, depth + 1)
                if found is not None:
                    return found
        elif isinstance(value, list):
            for position, item in enumerate(value):
                found = self._refused_at(item, f"{path}.{position}", depth + 1)
                if found is not None:
                    return found
        return None
