"""How a delivery is timed and retried, and when a breaker opens: the settings the SDK's ``call()``
(an agent TOML's ``[client]``) and the node's proxy (a topology's ``[node.proxy]``) share.

One object holds what httpx splits into ``Timeout`` and ``Limits`` and redis-py calls ``Retry``:
:class:`DeliverySettings` (in milliseconds, validated when built) gives the
:class:`~node.delivery.RetryPolicy` and the :class:`~node.delivery.AttemptLimits` that
:func:`~node.delivery.deliver` runs on. Its defaults are the SDK's; the proxy, which holds answers in
the node and answers callers that wait, takes other defaults for the same settings
(``node.config.ProxySettings``). :class:`BreakerSettings` are the node's breakers (its defaults)
and the SDK's own (``node.client.ClientSettings``, a lower threshold).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from ..core import DEFAULT_MAX_HOPS, MAX_HOPS_CEILING, Settings
from .attempts import AttemptLimits
from .outcomes import DEFAULT_BREAKER_COOLDOWN_MS, DEFAULT_BREAKER_FAILURES, DEFAULT_BREAKER_WINDOW_MS
from .retry import (
    DEFAULT_JITTER_RATIO,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_INITIAL_BACKOFF_MS,
    DEFAULT_RETRY_MAX_BACKOFF_MS,
    DEFAULT_RETRY_MULTIPLIER,
    RetryPolicy,
)

DEFAULT_CONNECT_TIMEOUT_MS = 3_000
DEFAULT_READ_TIMEOUT_MS = 10_000
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
# A guard against an answer that would fill the caller's memory, not a limit on real results
# (the proxy, which holds answers in the node, caps at 4 MiB).
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024

__all__ = ["DEFAULT_CONNECT_TIMEOUT_MS", "DEFAULT_MAX_RESPONSE_BYTES", "DEFAULT_READ_TIMEOUT_MS",
           "DEFAULT_REQUEST_TIMEOUT_MS", "BreakerSettings", "DeliverySettings"]


class DeliverySettings(Settings):
    """Timeouts, retries and the answer's size cap of one delivery; raises pydantic's
    ``ValidationError`` when built with a value out of bounds or a longest backoff below the first."""

    max_hops: int = Field(default=DEFAULT_MAX_HOPS, ge=1, le=MAX_HOPS_CEILING,
                          description="Hops an envelope may take (agent to agent, directly or through proxies) "
                                      "before it is refused; the SDK does not send one that reached it.")
    connect_timeout_ms: int = Field(default=DEFAULT_CONNECT_TIMEOUT_MS, ge=1, le=600_000,
                                    description="Connecting to a target agent.")
    read_timeout_ms: int = Field(default=DEFAULT_READ_TIMEOUT_MS, ge=1, le=3_600_000,
                                 description="Longest silence while reading a target's answer.")
    request_timeout_ms: int = Field(default=DEFAULT_REQUEST_TIMEOUT_MS, ge=1, le=3_600_000,
                                    description="Budget of one delivery (a call() or a send), all attempts and "
                                                "backoffs included.")
    max_attempts: int = Field(default=DEFAULT_MAX_ATTEMPTS, ge=1, le=20,
                              description="Attempts for an idempotent envelope (1 = no retry); others get one.")
    retry_initial_backoff_ms: int = Field(default=DEFAULT_RETRY_INITIAL_BACKOFF_MS, ge=0,
                                          description="Backoff before the first retry.")
    retry_max_backoff_ms: int = Field(default=DEFAULT_RETRY_MAX_BACKOFF_MS, ge=0,
                                      description="Longest backoff between retries; at least "
                                                  "retry_initial_backoff_ms.")
    retry_multiplier: float = Field(default=DEFAULT_RETRY_MULTIPLIER, ge=1.0, le=100.0,
                                    description="Backoff growth per retry.")
    jitter_ratio: float = Field(default=DEFAULT_JITTER_RATIO, ge=0.0, lt=1.0, description="Random share of each backoff.")
    max_response_bytes: int = Field(default=DEFAULT_MAX_RESPONSE_BYTES, ge=1,
                                    description="A target's answer (decoded) beyond this fails the attempt (and is "
                                                "tried elsewhere if idempotent).")

    @model_validator(mode="after")
    def _ordered(self) -> DeliverySettings:
        if self.retry_max_backoff_ms < self.retry_initial_backoff_ms:
            raise ValueError("retry_max_backoff_ms must be at least retry_initial_backoff_ms")
        return self

    def retry_policy(self) -> RetryPolicy:
        """The backoff between attempts, in seconds."""
        return RetryPolicy(initial_backoff_s=self.retry_initial_backoff_ms / 1000, multiplier=self.retry_multiplier,
                           max_backoff_s=self.retry_max_backoff_ms / 1000, jitter_ratio=self.jitter_ratio,
                           max_attempts=self.max_attempts)

    def attempt_limits(self, *, owner: str) -> AttemptLimits:
        """The limits of one attempt; ``owner`` names whose cap it is in messages ("the proxy's")."""
        return AttemptLimits(connect_timeout_s=self.connect_timeout_ms / 1000,
                             read_timeout_s=self.read_timeout_ms / 1000,
                             max_response_bytes=self.max_response_bytes, owner=owner)


class BreakerSettings(Settings):
    """When an agent's circuit breaker opens and how long it stays open
    (:class:`~node.delivery.OutcomeTracker`); the defaults are the node's."""

    breaker_failures: int = Field(default=DEFAULT_BREAKER_FAILURES, ge=1,
                                  description="Failures within breaker_window_ms that open an agent's circuit breaker.")
    breaker_window_ms: int = Field(default=DEFAULT_BREAKER_WINDOW_MS, ge=1,
                                   description="The window breaker_failures are counted in.")
    breaker_cooldown_ms: int = Field(default=DEFAULT_BREAKER_COOLDOWN_MS, ge=1,
                                     description="How long an open breaker waits before letting a trial call through.")
