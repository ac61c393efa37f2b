"""Delivering one call to an agent: attempts with their timeouts, retry and backoff, failover,
breakers and the A2A wire, and their settings (``DeliverySettings``, ``BreakerSettings``). Shared
by the SDK's ``call()`` and the node's proxy, so both follow the same rules.
"""

from .a2a_wire import UnsupportedBinding
from .attempts import AttemptError, AttemptLimits, Delivery, End, Failover, Pacing, Tried, deliver
from .outcomes import (
    DEFAULT_BREAKER_COOLDOWN_MS,
    DEFAULT_BREAKER_FAILURES,
    DEFAULT_BREAKER_WINDOW_MS,
    ERROR_RECHECK_MS,
    BreakerState,
    ClientBreakers,
    OutcomeTracker,
)
from .retry import (
    DEFAULT_JITTER_RATIO,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_INITIAL_BACKOFF_MS,
    DEFAULT_RETRY_MAX_BACKOFF_MS,
    DEFAULT_RETRY_MULTIPLIER,
    RetryPolicy,
    Sleep,
)
from .settings import BreakerSettings, DeliverySettings

__all__ = [
    "AttemptError",
    "AttemptLimits",
    "BreakerSettings",
    "BreakerState",
    "ClientBreakers",
    "DEFAULT_BREAKER_COOLDOWN_MS",
    "DEFAULT_BREAKER_FAILURES",
    "DEFAULT_BREAKER_WINDOW_MS",
    "DEFAULT_JITTER_RATIO",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_RETRY_INITIAL_BACKOFF_MS",
    "DEFAULT_RETRY_MAX_BACKOFF_MS",
    "DEFAULT_RETRY_MULTIPLIER",
    "Delivery",
    "DeliverySettings",
    "ERROR_RECHECK_MS",
    "End",
    "Failover",
    "OutcomeTracker",
    "Pacing",
    "RetryPolicy",
    "Sleep",
    "Tried",
    "UnsupportedBinding",
    "deliver",
]
