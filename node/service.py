"""``RegistryNode``: one region's node — store, cache, router, duties — and its operations.

The HTTP layer (``node.http.api``) is a thin translation of these operations; the federation and
semantic packages attach through ``router.remote``/``router.matcher``, ``leadership.add_duty``
and ``extensions`` (callables that add routes to the aiohttp app before it starts). Its
collaborators are built and wired by :func:`node.parts.build_parts` and passed in.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable

from aiohttp import web
from pydantic import ValidationError

from .config import NodeConfig
from .core import (Forbidden, NodeError, NotFound, SearchUnavailable, Unauthorized, UnknownAgent, ValidationFailed,
                   first_problem, now_ms)
from .core.a2a import CardRegistration, card_field, card_to_registration
from .core.models import (AGENT_ID_RE, AgentRecord, CardListing, ChangeEvent, ChangeKind, CredentialRequest,
                          DeleteReason, Heartbeat, IssuedCredential, Load, LoadReportResponse, OutcomeReport,
                          RegisterResponse, Registration, RevocationRequest, RouteRequest, RouteTicket, Scope,
                          SearchResponse, TokenClaims, TokenRole)
from .delivery import BreakerState
from .parts import NodeParts, build_parts
from .routing import AgentQuery, Decision, Searcher, SummaryOnlyLookups
from .store import HeartbeatResult, stored_version
from .trust import EgressDenied, Revocation, admits, authorize_agent
from .view import HTTP_HOLDER, CacheState

log = logging.getLogger(__name__)

NO_LOAD = Load()  # a new record's load (shared: loads are replaced, never changed in place)

Extension = Callable[[web.Application], None]


class NodeState(enum.Enum):
    """NEW → STARTING → RUNNING → DRAINING (readiness 503, requests still served) → CLOSED."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    CLOSED = "closed"


class RegistryNode:
    """A regional registry node; ``async with RegistryNode(config, secret=…) as node``.

    Starting loads the region's snapshot from Redis (raises :class:`StoreUnavailable` if it
    cannot be reached) and campaigns for the singleton duties; closing stops them all.
    """

    def __init__(self, config: NodeConfig, *, secret: bytes | None = None, parts: NodeParts | None = None) -> None:
        """``parts``: the node's collaborators, built from the same ``config`` by
        :func:`node.parts.build_parts` (the composition root's way, ``topology.composition``).
        Given ``secret`` instead, the node builds them itself with it (a convenience for tests)."""
        if parts is None:
            if secret is None:
                raise TypeError("RegistryNode needs secret= (to build its parts from config) "
                                "or parts= (node.parts.build_parts)")
            parts = build_parts(config, secret=secret)
        elif secret is not None:
            raise TypeError("RegistryNode takes parts= or secret=, not both: the parts' signer holds the secret")
        self.config = config
        self.region = config.region
        self.node_id = parts.node_id
        self.signer = parts.signer
        self.store = parts.store
        self.cache = parts.cache
        self.outcomes = parts.outcomes
        self.keys = parts.keys
        self.router = parts.router
        self.leadership = parts.leadership
        self.sweeper = parts.sweeper
        self.prober = parts.prober
        self.watch = parts.watch
        self.metrics = parts.metrics
        self.revocations = parts.revocations
        self.acl = parts.acl
        self.decisions = parts.decisions
        self.loop_watch = parts.loop_watch
        self.tracing = parts.tracing
        self.budgets = parts.budgets
        self.summary_only = SummaryOnlyLookups(self.router, visible=self.visible)
        self.extensions: list[Extension] = []
        self.searcher: Searcher | None = None
        self.state = NodeState.NEW

    async def __aenter__(self) -> RegistryNode:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        if self.state is not NodeState.NEW:
            return
        self.state = NodeState.STARTING
        try:
            await self.cache.start()
            await self.keys.start()
            await self.revocations.start()
            await self.budgets.start()
            await self.acl.start()
            await self.leadership.start()
            self.loop_watch.start()
        except BaseException:
            await self.aclose()
            raise
        self.state = NodeState.RUNNING
        log.info("region %s: node %s serving %d agents at version %d", self.region, self.node_id,
                 len(self.cache.index), self.cache.index.version)

    async def aclose(self) -> None:
        if self.state is NodeState.CLOSED:
            return
        self.state = NodeState.CLOSED
        await self.loop_watch.aclose()
        await self.leadership.aclose()
        await self.budgets.aclose()
        await self.revocations.aclose()
        await self.acl.aclose()
        await self.keys.aclose()
        await self.cache.aclose()
        await self.store.aclose()
        self.decisions.close()
        await self.tracing.aclose()

    def begin_drain(self) -> None:
        """Report not-ready from now on (load balancers stop sending) while requests are still served."""
        if self.state is NodeState.RUNNING:
            self.state = NodeState.DRAINING
            log.info("region %s: node %s draining", self.region, self.node_id)

    @property
    def ready(self) -> bool:
        """Serving and its Redis reachable (reads go on from memory while it is not)."""
        return self.state is NodeState.RUNNING and self.cache.state is CacheState.RUNNING

    # -- identity ----------------------------------------------------------------------------

    def authenticate(self, authorization: str | None, *, remember: bool = True) -> TokenClaims:
        """The caller's claims from an ``Authorization`` header; raises :class:`Unauthorized` for a
        missing, forged, expired or revoked token (``node.trust.revocation``). ``remember``: keep
        the verified token for the next request (``Signer.verify``)."""
        if not authorization:
            raise Unauthorized("send 'Authorization: Bearer <token>'; 'agent-reach token issue' prints one",
                               code="missing_token")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("the Authorization header must be 'Bearer <token>'", code="invalid_token")
        claims = self.signer.verify(token.strip(), remember=remember)
        # A forwarded request (federation.forward) comes with a token the forwarding node minted:
        # the caller's own token, named by fwd.jti, is what this region may have revoked.
        if self.revocations.refuses(claims):
            raise Unauthorized("the token was revoked; ask for a new one ('agent-reach token issue')",
                               code="token_revoked")
        return claims

    async def revoke_token(self, request: RevocationRequest, caller: TokenClaims) -> Revocation:
        """Refuse the token ``request.jti`` on every node of this region until it expires (admins only)."""
        if caller.role is not TokenRole.ADMIN:
            raise Forbidden("revoking tokens is for admins", code="admins_only")
        try:
            revocation = await self.revocations.revoke(request.jti, expires_at_s=request.exp)
        except ValueError as exc:
            raise ValidationFailed(str(exc), field="exp") from None
        log.info("region %s: token %s revoked until %d (by %s)", self.region, request.jti, request.exp, caller.sub)
        return revocation

    # -- operations --------------------------------------------------------------------------

    async def register(self, registration: Registration, caller: TokenClaims, *,
                       card: CardListing | None = None) -> tuple[RegisterResponse, bool]:
        """Upsert; returns the response and whether the agent was new to this region (``card``: the
        A2A card it was registered from, kept with the record)."""
        authorize_agent(caller, registration.agent_id)
        denied = self.config.egress.check_registration(registration)
        if denied is not None:  # an address this region never contacts nor hands out (422 naming the field)
            raise denied
        if not self.config.transport_allowed(registration.transport):
            raise ValidationFailed(
                f"region {self.region} does not allow transport {registration.transport!r}; "
                f"allowed: {', '.join(self.config.allowed_transports or [])}",
                field="transport", code="transport_not_allowed")
        now = now_ms()
        # The registration was validated as it was parsed and the rest is the node's own: the
        # record is assembled, not validated a second time (the hot write path).
        # Every field given: a default pydantic fills in costs a look at its factory's signature.
        record = AgentRecord.model_construct(
            **registration.__dict__, region=self.region, version=0, load=NO_LOAD, registered_at_ms=now,
            updated_at_ms=now, lease_expires_at_ms=now + registration.lease_ttl_ms, live=True,
            ready=registration.readiness_probe is None, probe_error=None, a2a=card)
        stored, created = await self.store.register(record, at_ms=now)
        self.cache.apply_local(ChangeEvent(kind=ChangeKind.UPSERT, region=self.region, version=stored.version,
                                           agent_id=stored.agent_id, at_ms=now, record=stored))
        self.metrics.registrations.inc()
        response = RegisterResponse(agent_id=stored.agent_id, region=self.region, version=stored.version,
                                    lease_expires_at_ms=stored.lease_expires_at_ms,
                                    heartbeat_interval_ms=max(100, stored.lease_ttl_ms // 3))
        return response, created

    async def heartbeat(self, agent_id: str, heartbeat: Heartbeat, caller: TokenClaims, *,
                        session: bool = False) -> HeartbeatResult:
        """Renew the lease; a new status is a change of the record (a version, an event for
        peers), a new load is not (``node.store.loads``: load stays home). The API answers from the
        result's version, lease and ``changed`` (``HeartbeatResponse``'s fields). ``session``: a
        renewal over a session (``node.http.sessions``), counted apart; an HTTP heartbeat is a sign
        of life that clears a suspect mark (``node.view.suspects``)."""
        authorize_agent(caller, agent_id)
        now = now_ms()
        known = self.cache.index.get(agent_id)
        load = heartbeat.load if heartbeat.load is not None and (known is None or heartbeat.load != known.load) else None

        def mutate(current: AgentRecord) -> AgentRecord | None:
            if heartbeat.status is None or heartbeat.status == current.status:
                return None
            return current.model_copy(update={"status": heartbeat.status, "load": heartbeat.load or current.load})

        result = await self.store.update(agent_id, mutate, at_ms=now, known=known, renew_lease=True, load=load)
        if result.changed:
            self.cache.apply_local(ChangeEvent(kind=ChangeKind.STATUS, region=self.region,
                                               version=result.version, agent_id=agent_id, at_ms=now,
                                               record=result.stored))
        else:
            self.cache.touch_lease(agent_id, result.lease_expires_at_ms)
        if load is not None:
            self.cache.index.set_load(agent_id, load)
        if not session and agent_id in self.cache.index.suspects:
            await self.cache.suspects.hold([agent_id], session=HTTP_HOLDER)
        self.metrics.count(self.metrics.session_renewals if session else self.metrics.heartbeats,
                           "changed" if result.changed else "load" if load is not None else "lease")
        return result

    async def report_load(self, agent_id: str, load: Load, caller: TokenClaims) -> LoadReportResponse:
        """Store the load an agent reports between heartbeats: no lease moved, no version, no
        stream entry (``node.store.loads``); 404 when its lease has passed."""
        authorize_agent(caller, agent_id)
        now = now_ms()
        known = self.cache.index.get(agent_id)
        # The same load again, on a lease this node knows to be running, needs no write.
        if known is None or known.load != load or known.lease_expires_at_ms <= now:
            await self.store.report_load(agent_id, load, at_ms=now)
            self.cache.index.set_load(agent_id, load)
        self.metrics.load_reports.inc()
        return LoadReportResponse(agent_id=agent_id, at_ms=now)

    async def deregister(self, agent_id: str, caller: TokenClaims) -> int:
        authorize_agent(caller, agent_id)
        now = now_ms()
        version = await self.store.deregister(agent_id, at_ms=now)
        if version is None:
            raise UnknownAgent(f"agent {agent_id} is not registered in region {self.region}", field="agent_id")
        known = self.cache.index.get(agent_id)
        self.cache.apply_local(ChangeEvent(kind=ChangeKind.DELETE, region=self.region, version=version,
                                           agent_id=agent_id, at_ms=now, reason=DeleteReason.DEREGISTERED,
                                           allowed_callers=known.allowed_callers if known is not None else None))
        self.metrics.deregistrations.inc()
        return version

    def get(self, agent_id: str, caller: TokenClaims) -> AgentRecord:
        """:meth:`find`, raising :class:`NotFound` (``unknown_agent``) when nobody has it — or
        when ``caller`` may not see it (``allowed_callers``): a hidden agent does not exist."""
        record = self.find(agent_id)
        if record is None or not self.visible(record, caller):
            raise NotFound(f"no agent {agent_id} in region {self.region} or its peers", field="agent_id",
                           code="unknown_agent")
        return record

    async def lookup(self, agent_id: str, caller: TokenClaims) -> AgentRecord:
        """:meth:`get`, then the nodes of summary-only peers (:class:`~node.routing.SummaryOnlyLookups`);
        raises :class:`ValidationFailed` for an ``agent_id`` that is no agent id (before it goes into a path)."""
        if not AGENT_ID_RE.match(agent_id):
            raise ValidationFailed("agent_id must be three dot-separated parts of lowercase letters, digits, '_' "
                                   "and '-' (e.g. payment.risk_check.prod_01)", field="agent_id")
        try:
            return self.get(agent_id, caller)
        except NotFound:
            if not self.summary_only.regions(caller):
                raise
        return await self.summary_only.agent(agent_id, caller)

    def visible(self, record: AgentRecord, caller: TokenClaims) -> bool:
        """Whether ``caller`` may see ``record`` on any route (its ``allowed_callers``, the ACL rules)."""
        return admits(caller, record, acl=self.acl)

    def visible_id(self, agent_id: str, caller: TokenClaims) -> bool:
        """:meth:`visible` for an agent id; an agent this node does not hold (gone) is not shown."""
        record = self.find(agent_id)
        return record is not None and self.visible(record, caller)

    def records_held(self) -> int:
        """Records in memory: this region's and, with federation, the peers' replicas."""
        held = len(self.cache.index)
        if self.router.remote is not None:
            held += sum(len(peer.index) for peer in self.router.remote.peers())
        return held

    def routable(self, record: AgentRecord) -> bool:
        """Would the router consider this record (local or remote), breakers aside?"""
        if not record.routable_state or record.agent_id in self.cache.index.suspects:
            return False
        # Remote records carry no live lease: their home region deletes them when it ends.
        return record.region != self.region or record.lease_expires_at_ms > self.cache.routable_now_ms()

    def find(self, agent_id: str) -> AgentRecord | None:
        """A record from this region or, with federation attached, from a peer's replica."""
        record = self.cache.index.get(agent_id)
        if record is not None or self.router.remote is None:
            return record
        for peer in self.router.remote.peers():
            record = peer.index.get(agent_id)
            if record is not None:
                return record
        return None

    def list_agents(self, query: AgentQuery, caller: TokenClaims) -> list[AgentRecord]:
        """The records ``query`` selects that ``caller`` may see (and routable, if it asks): this
        region's and, unless its scope is local, the peers' replicas; this region's first, then by
        region and agent id."""
        indexes = [self.cache.index]
        if query.scope is not Scope.LOCAL and self.router.remote is not None:
            indexes += [peer.index for peer in self.router.remote.peers()]
        found = [record for index in indexes for record in query.select(index)
                 if (not query.routable_only or self.routable(record)) and self.visible(record, caller)]
        found.sort(key=lambda record: (record.region != self.region, record.region, record.agent_id))
        return found

    async def resolve(self, request: RouteRequest, caller: TokenClaims, *,
                      extensions: dict[str, object] | None = None) -> RouteTicket:
        return (await self.decide(request, caller, extensions=extensions)).ticket()

    async def search(self, query: str, *, k: int, scope: Scope, routable_only: bool,
                     caller: TokenClaims) -> SearchResponse:
        """Natural-language search over what ``caller`` may see; raises :class:`SearchUnavailable`
        when none is attached."""
        if self.searcher is None:
            raise SearchUnavailable("natural-language search is not attached to this node "
                                    "(run it with 'agent-reach node', which attaches it)")
        started = time.perf_counter()
        here = self.searcher.search(query, k=k, scope=scope, routable_only=routable_only,
                                    visible=lambda record: self.visible(record, caller))
        if scope is Scope.GLOBAL:  # and the summary-only peers, asked by their nodes
            response = await self.summary_only.search(here, query, k=k, routable_only=routable_only, caller=caller)
        else:
            response = await here
        self.metrics.observe(self.metrics.search_seconds, time.perf_counter() - started, response.mode)
        return response

    async def register_card(self, request: CardRegistration, caller: TokenClaims) -> tuple[RegisterResponse, bool]:
        """Register an agent from its A2A card (see :mod:`node.core.a2a`)."""
        try:
            registration, listing, sources = card_to_registration(request)
        except ValidationError as exc:  # the registration the card describes breaks a limit
            first = first_problem(exc)
            field = card_field(first.location)
            raise ValidationFailed(f"{field}: {first.message}", field=field) from None
        except ValueError as exc:
            message = str(exc)
            field, _, detail = message.partition(": ")
            raise ValidationFailed(message, field=field if detail else "card") from None
        try:
            return await self.register(registration, caller, card=listing)
        except EgressDenied as denied:  # name the card's field, not the registration's
            field = sources.get(denied.field or "", "card")
            message = denied.message.removeprefix(f"{denied.field}: ")
            raise EgressDenied(f"{field}: {message}", address=denied.address, rule=denied.rule, field=field) from None

    async def decide(self, request: RouteRequest, caller: TokenClaims, *,
                     extensions: dict[str, object] | None = None) -> Decision:
        """Like :meth:`resolve`, as the router's :class:`Decision` (``to_json()`` is cheap); the
        decision, or why there is none, goes to the decision log (:mod:`node.routing.decisions`),
        with ``extensions`` (a proxied envelope's, masked by the proxy) on the line."""
        try:
            decision = await self.router.decide(request, caller)
        except NodeError as exc:
            known = request.agent_id is not None and self.find(request.agent_id) is not None
            self.decisions.refused(request, caller, exc, at_ms=now_ms(), known=known)
            raise
        self.decisions.decided(decision, at_ms=decision.issued_at_ms, extensions=extensions)
        return decision

    def recent_decisions(self, agent_id: str, caller: TokenClaims) -> list[dict[str, object]]:
        """This node's recent decisions and outcomes about an agent ``caller`` may see (newest
        first; only the caller's own unless admin, peer or the agent); :class:`NotFound` otherwise."""
        record = self.find(agent_id)
        if record is not None and not self.visible(record, caller):
            record = None
        entries = self.decisions.recent(agent_id, caller, visible=lambda other: self.visible_id(other, caller))
        if record is None and not (entries and caller.role is TokenRole.ADMIN):
            raise NotFound(f"no agent {agent_id} in region {self.region} or its peers", field="agent_id",
                           code="unknown_agent")
        return entries

    def report(self, report: OutcomeReport, caller: TokenClaims) -> None:
        """Feed one call outcome into the error penalty and breaker of the agent called."""
        now = now_ms()
        claims = self._ticket_claims(report.signature, report.agent_id, caller,
                                     deadline_ms=lambda e: e + self.config.report_grace_ms, now=now,
                                     too_old="the ticket is too old to report on")
        reporter = None if caller.role in (TokenRole.ADMIN, TokenRole.PEER) else caller.sub  # trusted: node.outcomes
        ticket_id = claims["t"] if isinstance(claims.get("t"), str) else None
        self.outcomes.record(report.agent_id, report.outcome, now_ms=now, reporter=reporter, ticket_id=ticket_id)
        self.metrics.reports(report.outcome.value).inc()
        self.decisions.outcome(at_ms=now, ticket_id=ticket_id,
                               caller=caller.sub, agent_id=report.agent_id, outcome=report.outcome.value,
                               latency_ms=report.latency_ms)

    def breakers(self, caller: TokenClaims) -> list[dict[str, object]]:
        """This node's breaker state and error factor of every agent it learnt about from reports
        (a closed breaker with a clean record is left out) that ``caller`` may see."""
        now, found = now_ms(), []
        for agent_id in self.outcomes.tracked():
            state = self.outcomes.state(agent_id, now_ms=now)
            factor = self.outcomes.weight_factor(agent_id, now_ms=now)
            record = self.find(agent_id)
            if record is None or not self.visible(record, caller) or (state is BreakerState.CLOSED and factor >= 1.0):
                continue
            found.append({"agent_id": agent_id, "state": state.value, "error_factor": round(factor, 4)})
        return sorted(found, key=lambda entry: str(entry["agent_id"]))

    def issue_credential(self, request: CredentialRequest, caller: TokenClaims) -> IssuedCredential:
        """The route credential for one of a ticket's alternates (``POST /v1/credentials``).

        Only the caller the ticket was issued to gets one, for an agent the ticket names and it may
        still reach (the ACL rules), before the ticket expires (the credential expires with it);
        raises :class:`Forbidden` otherwise.
        """
        now = now_ms()
        claims = self._ticket_claims(request.signature, request.agent_id, caller, deadline_ms=lambda e: e, now=now,
                                     too_old="the ticket has expired: resolve again", admin_reports=False)
        agents: list[str] = claims["a"]  # type: ignore[assignment]
        index = agents.index(request.agent_id)
        capabilities = claims.get("k")
        capability = capabilities[index] if isinstance(capabilities, list) and index < len(capabilities) else None
        record = self.find(request.agent_id)  # an ACL rule set since the ticket holds for its alternates too
        if record is not None and not admits(caller, record, capability=capability, acl=self.acl):
            raise Forbidden(f"agent {request.agent_id} is not for {caller.sub!r} any more", field="agent_id")
        expires = int(claims["e"])  # type: ignore[call-overload]
        credential = self.keys.issue(caller=caller, agent_id=request.agent_id, capability=capability,
                                     ticket_id=str(claims.get("t")), index=index, expires_at_ms=expires, now_ms_=now)
        return IssuedCredential(agent_id=request.agent_id, credential=credential, expires_at_ms=expires)

    def _ticket_claims(self, signature: str, agent_id: str, caller: TokenClaims, *,
                       deadline_ms: Callable[[int], int], now: int, too_old: str,
                       admin_reports: bool = True) -> dict[str, object]:
        """The claims of a ticket this cluster signed that names ``agent_id`` and was issued to
        ``caller`` (admins may report on any when ``admin_reports``), until ``deadline_ms(expiry)``."""
        claims = self.signer.verify_ticket(signature)
        if agent_id not in claims.get("a", []):  # type: ignore[operator]
            raise Forbidden(f"the ticket does not name agent {agent_id}", field="agent_id",
                            code="agent_not_in_ticket")
        if not (admin_reports and caller.role is TokenRole.ADMIN) and claims.get("c") != caller.sub:
            raise Forbidden("only the caller a ticket was issued to may use it", field="signature")
        if deadline_ms(int(claims.get("e", 0))) < now:  # type: ignore[call-overload]
            raise Forbidden(too_old, field="signature", code="ticket_expired")
        return claims

    def vetted(self, agent_id: str, raw: str) -> bool:
        """Whether a stored record may be served raw: parsed only when the cache does not hold it
        at the same version (the cache parsed it already); one that does not parse is quarantined,
        so a peer never receives what this region could not read back."""
        known = self.cache.index.get(agent_id)
        if known is not None and stored_version(raw) == known.version:
            return True
        return self.store.vet_record_json(agent_id, raw)


__all__ = ["RegistryNode", "NodeState"]
