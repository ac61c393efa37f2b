"""One attempt of a direct call: POST the envelope (or the raw payload) to one target, judge its answer."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from ._client_http import as_envelope
from .envelope import PASSTHROUGH, Envelope, raw_payload
from .models import Outcome, RouteTarget


class AttemptError(Exception):
    """One attempt failed: its outcome for the breaker and reports, and whether another agent may be tried."""

    def __init__(self, outcome: Outcome, message: str, *, status: int | None = None, body: Any = None,
                 retryable: bool = True) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.status = status
        self.body = body
        self.retryable = retryable


async def deliver(session: aiohttp.ClientSession, target: RouteTarget, envelope: Envelope,
                  timeouts: aiohttp.ClientTimeout, remaining_s: float) -> tuple[int, Any, Envelope | None]:
    """The target's status, decoded body and response envelope; raises :class:`AttemptError`.

    ``timeouts`` gives the connect and read timeouts; ``remaining_s`` caps the whole attempt.
    A 4xx other than 408 and 429 is not retryable: the request itself is wrong.
    """
    if target.transport == PASSTHROUGH:
        data, content_type = raw_payload(envelope.payload)
    else:
        data, content_type = envelope.model_copy(update={"target_agent": target.agent_id}).to_json(), \
            "application/json"
    headers = {"Content-Type": content_type, "X-Reach-Trace-Id": envelope.trace_id,
               "X-Reach-Envelope-Id": envelope.id}
    timeout = aiohttp.ClientTimeout(total=remaining_s, sock_connect=timeouts.sock_connect,
                                    sock_read=timeouts.sock_read)
    try:
        async with session.post(target.endpoint, data=data, headers=headers, timeout=timeout) as resp:
            raw = await resp.read()
            status = resp.status
            is_json = resp.content_type == "application/json"
    except asyncio.CancelledError:
        raise
    except TimeoutError as exc:
        raise AttemptError(Outcome.TIMEOUT, f"timed out: {exc or 'no answer in time'}") from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise AttemptError(Outcome.FAILURE, f"{type(exc).__name__}: {exc}") from exc
    body: Any = raw
    if is_json and raw:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = raw
    if status == 429:
        raise AttemptError(Outcome.REJECTED, "HTTP 429 (the target is overloaded)", status=status, body=body)
    if status >= 500 or status == 408:
        raise AttemptError(Outcome.FAILURE, f"HTTP {status}", status=status, body=body)
    if status >= 400:
        raise AttemptError(Outcome.SUCCESS, f"HTTP {status}: {str(body)[:200]}", status=status, body=body,
                           retryable=False)
    return status, body, (None if target.transport == PASSTHROUGH else as_envelope(body))




__all__ = ["PASSTHROUGH", "AttemptError", "deliver", "raw_payload"]
