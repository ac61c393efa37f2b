"""Forwarded lookups: asking a summary-only peer's node, as the caller, within a deadline.

A region keeps only summaries of the peers beyond its ``replicate_depth``; what it needs of their
agents — a record by id, a global search's hits, a resolve its summary sent there — it asks their
node (:class:`Forwarder`, the node's ``node.remote.PeerForwarder``). The request carries a bearer
token this region mints for the caller's own subject and role (``TOKEN_TTL_S`` at most, never past
the caller's own token; signed with the cluster secret every region shares), not a peer token,
and marked as forwarded (``TokenClaims.fwd``: this region and the caller's own token id,
:meth:`node.trust.Signer.issue_forwarded`). The peer then applies its own checks to the real
caller — its revocations (of the caller's token id too), visibility rules and rate limit — and
signs the route ticket and credential for it, exactly as if the caller had asked it; and it never
forwards a request so marked again (nor does this forwarder send one), so one lookup costs at
most one forward per summary-only peer. Resolves go with ``scope=local`` as well. An agent id is
checked against the agent-id pattern and percent-encoded before it goes into a path.

Every call has one deadline (``forward_timeout_ms``) across the peer's node URLs, tried in order;
when it passes, or no node answers, :class:`node.core.errors.PeerUnreachable` says which region and
why, and the caller falls back to what it has. An answer below 500 — a 404 saying it has no
such agent, a refusal of the caller — is an answer, not silence. A peer that did not answer is
then not asked for ``forward_backoff_ms``: a region that hangs rather than refuses would
otherwise cost the whole deadline on every lookup that lands on it until its summary goes stale;
meanwhile those lookups fail over at once, and the first call after the pause tries it again.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
from pydantic import ValidationError

from node.core import BodyTooLarge, NoAgentAvailable, PeerUnreachable, ValidationFailed, first_problem, read_bounded
from node.core.models import (
    AGENT_ID_RE,
    AgentRecord,
    RouteRequest,
    Scope,
    SearchHit,
    SearchResponse,
    TokenClaims,
    compat,
)
from node.trust import Signer

from .config import FederationConfig

log = logging.getLogger(__name__)

__all__ = ["Forwarder", "TOKEN_TTL_S"]

TOKEN_TTL_S = 60
_ANSWER_LIMIT_BYTES = 8 * 1024 * 1024


class Forwarder:
    """Asks summary-only peers' nodes (see the module docstring); an async context manager."""

    def __init__(self, config: FederationConfig, *, signer: Signer, clock: Callable[[], float] = time.monotonic,
                 ssl_context: ssl.SSLContext | bool = True) -> None:
        self.config = config
        self.ssl_context = ssl_context  # what a peer's https node is checked against
        self.signer = signer
        self.clock = clock
        self.forwarded = 0
        self.unanswered = 0
        self.skipped = 0  # lookups failed over at once: their region did not answer shortly before
        self._silent_since: dict[str, float] = {}  # region -> when it last did not answer (clock seconds)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl_context))

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Forwarder:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- node.remote.PeerForwarder -----------------------------------------------------------

    async def agent(self, region: str, agent_id: str, caller: TokenClaims) -> AgentRecord | None:
        """Raises :class:`ValidationFailed` (nothing sent) for an ``agent_id`` that is no agent id."""
        if not AGENT_ID_RE.match(agent_id):
            raise ValidationFailed("agent_id must be an agent id (<part>.<part>.<part>) to be forwarded",
                                   field="agent_id")
        status, body = await self._call(region, "GET", f"/v1/agents/{quote(agent_id, safe='')}", caller)
        if status != 200:
            return None
        try:
            record = compat.read_json(AgentRecord, body)
        except ValidationError as exc:
            raise PeerUnreachable(f"region {region}'s node answered no agent record ({first_problem(exc).message})") from exc
        return record if record.region == region else None

    async def resolve(self, region: str, request: RouteRequest, caller: TokenClaims) -> dict[str, object]:
        local = request.model_copy(update={"scope": Scope.LOCAL, "preferred_region": None})
        status, body = await self._call(region, "POST", "/v1/resolve", caller, params={"remote": "true"},
                                        json=local.model_dump(mode="json", exclude_none=True))
        answer = _json(body)
        if status == 200 and isinstance(answer, dict):
            return answer
        message = answer.get("message") if isinstance(answer, dict) else None
        verdict = "refused the caller" if status in (401, 403, 429) else "found nobody"
        raise NoAgentAvailable(f"region {region}'s node {verdict}: {message or f'HTTP {status}'}")

    async def search(self, region: str, query: str, *, k: int, routable_only: bool,
                     caller: TokenClaims) -> list[SearchHit]:
        params = {"q": query, "k": str(k), "scope": Scope.LOCAL.value, "routable": "true" if routable_only else "false"}
        status, body = await self._call(region, "GET", "/v1/search", caller, params=params)
        if status != 200:
            return []
        try:
            return compat.read_json(SearchResponse, body).hits
        except ValidationError:
            return []

    # -- the calls ---------------------------------------------------------------------------

    async def _call(self, region: str, method: str, path: str, caller: TokenClaims, *, json: Any = None,
                    params: dict[str, str] | None = None) -> tuple[int, bytes]:
        """The first answer below 500 from ``region``'s nodes within the deadline (one forward: the
        next node of the region is asked only when one did not answer); raises PeerUnreachable, also
        for a request that arrived forwarded (it is never forwarded again; nothing is sent)."""
        if caller.fwd is not None:
            raise PeerUnreachable(f"the request arrived forwarded from region {caller.fwd.region}; a forwarded "
                                  "request is never forwarded again")
        if self._session is None:
            raise PeerUnreachable("forwarding is not started (the federation is not running)")
        try:
            urls = self.config.peer(region).node_urls
        except KeyError:
            raise PeerUnreachable(f"region {region} is not a peer of {self.config.region}") from None
        silent_since = self._silent_since.get(region)
        if silent_since is not None:
            silent_for_s = self.clock() - silent_since
            quiet_s = self.config.forward_backoff_ms / 1000 - silent_for_s
            if quiet_s > 0:
                self.skipped += 1
                raise PeerUnreachable(f"region {region} did not answer {silent_for_s:.1f} s ago; "
                                      f"it is asked again in {quiet_s:.1f} s")
        token = self.signer.issue_forwarded(caller, region=self.config.region, ttl_s=TOKEN_TTL_S)
        headers = {"Authorization": f"Bearer {token}"}
        deadline_ms = self.config.forward_timeout_ms
        problems: list[str] = []
        self.forwarded += 1
        try:
            async with asyncio.timeout(deadline_ms / 1000):
                for url in urls:
                    try:
                        async with self._session.request(method, url.rstrip("/") + path, json=json, params=params,
                                                         headers=headers, allow_redirects=False) as response:
                            # read(n) returns what has arrived, up to n: a long answer came back cut
                            body = await read_bounded(response, _ANSWER_LIMIT_BYTES)
                            if response.status < 500:  # a 404 or a refusal is an answer, not silence
                                self._silent_since.pop(region, None)
                                return response.status, body
                            problems.append(f"{url}: HTTP {response.status}")
                    except BodyTooLarge as exc:
                        problems.append(f"{url}: {exc}")
                    except (aiohttp.ClientError, OSError) as exc:
                        problems.append(f"{url}: {exc.__class__.__name__}")
        except TimeoutError:
            problems.append(f"no answer within {deadline_ms} ms")
        self.unanswered += 1
        self._silent_since[region] = self.clock()
        raise PeerUnreachable(f"region {region} did not answer ({'; '.join(problems) or 'no node URL'})")


def _json(body: bytes) -> object:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
