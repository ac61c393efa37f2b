"""``agent-reach preflight --config agent.toml``: check an agent's config against its node.

Run before the agent starts, so a misconfigured agent never starts half-working (registering
forever against a node that will always refuse it). Checks, in order — each later check needs
the earlier ones::

    config      the TOML parses and the [agent] registration is valid
    token       a token is configured (token, token_file, token_env or $AGENT_REACH_TOKEN)
    node        the node answers /healthz
    auth        the node accepts the token (GET /v1/policy)
    identity    the token may register this agent_id (its own agent token, or admin)
    transport   the region's policy allows the agent's transport
    endpoint    (--check-endpoint) the agent's primary endpoint accepts TCP connections

Exit status: 0 all passed, 1 a check failed (the line says why and how to fix it), 2 the
config file itself is unusable.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from node.client import (
    AgentConfig,
    AgentConfigError,
    NodeError,
    NodeUnreachable,
    ReachClient,
    TokenRole,
    Unauthorized,
    load_agent_config,
)

from .nodeurl import add_node_option, node_url_of

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_CONFIG = 2
TOKEN_EXPIRY_WARNING_S = 24 * 3600


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'}  {self.name:<10} {self.detail}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``preflight``'s options, on the parser :mod:`.entrypoint` made for it."""
    parser.add_argument("--config", required=True, help="the agent TOML file (see README: 'The agent TOML')")
    add_node_option(parser)
    parser.add_argument("--check-endpoint", action="store_true",
                        help="also check that the agent's primary endpoint accepts connections")
    parser.set_defaults(func=lambda args: asyncio.run(main(args)))


async def main(args: argparse.Namespace) -> int:
    try:
        config = node_url_of(load_agent_config(args.config), args.node)
    except AgentConfigError as exc:
        print(Check("config", False, exc.message).line())
        return EXIT_BAD_CONFIG
    checks = await run_preflight(config, check_endpoint=args.check_endpoint)
    for check in checks:
        print(check.line())
    failed = [check for check in checks if not check.ok]
    if failed:
        print(f"preflight failed: {failed[0].name}: {failed[0].detail}", file=sys.stderr)
        return EXIT_FAILED
    print("preflight passed")
    return EXIT_OK


async def run_preflight(config: AgentConfig, *, check_endpoint: bool = False) -> list[Check]:
    """Every check that could run; the first failure ends the list (later checks depend on it)."""
    checks: list[Check] = []
    registration = config.agent
    if registration is None:
        return [Check("config", False, f"{config.source or 'the config'} has no [agent] section to register")]
    checks.append(Check("config", True, f"{config.source or 'config'}: agent {registration.agent_id}, "
                                        f"transport {registration.transport}"))
    try:
        token = config.resolve_token()
    except AgentConfigError as exc:
        return [*checks, Check("token", False, exc.message)]
    checks.append(Check("token", True, "configured"))

    url = config.node.url
    if url is None:
        return [*checks, Check("node", False, "no node URL: give --node, [node] url or $AGENT_REACH_URL")]
    async with ReachClient(url, token=token, settings=config.client) as client:
        try:
            health = await client.node_health()
        except NodeError as exc:
            detail = exc.message if isinstance(exc, NodeUnreachable) else f"/healthz answered {exc.code}: {exc.message}"
            return [*checks, Check("node", False, f"{detail} — is the node running at {url}?")]
        checks.append(Check("node", True, f"{url} answers (region {health.get('region', '?')})"))

        try:
            policy = await client.policy()
        except Unauthorized as exc:
            return [*checks, Check("auth", False, f"the node rejects the token ({exc.code}): {exc.message}; issue "
                                                  f"one with 'agent-reach token issue --agent {registration.agent_id}' "
                                                  "using this cluster's secret")]
        except NodeError as exc:
            return [*checks, Check("auth", False, f"GET /v1/policy failed ({exc.code}): {exc.message}")]
        claims = policy.caller
        remaining_s = claims.exp - time.time()
        expiry = f", expires in {remaining_s / 3600:.1f} h" if remaining_s < TOKEN_EXPIRY_WARNING_S else ""
        checks.append(Check("auth", True, f"token accepted: {claims.sub} ({claims.role.value}){expiry}"))

        if claims.role is TokenRole.ADMIN or (claims.role is TokenRole.AGENT and claims.sub == registration.agent_id):
            checks.append(Check("identity", True, f"the token may register {registration.agent_id}"))
        else:
            return [*checks, Check("identity", False,
                                   f"the token is for {claims.sub!r} ({claims.role.value}), so it may not register "
                                   f"{registration.agent_id}; use that agent's own token")]

        allowed = policy.allowed_transports
        if allowed is not None and registration.transport not in allowed:
            return [*checks, Check("transport", False,
                                   f"region {policy.region} forbids transport {registration.transport!r}; "
                                   f"allowed: {', '.join(allowed) or 'none'} — change [agent] transport")]
        checks.append(Check("transport", True, f"{registration.transport!r} allowed in region {policy.region}"))

    if check_endpoint:
        checks.append(await _check_endpoint(registration.endpoints["primary"],
                                            timeout_s=config.client.connect_timeout_ms / 1000))
    return checks


async def _check_endpoint(url: str, *, timeout_s: float) -> Check:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme in ("https", "wss", "grpcs") else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port), timeout_s)
    except (OSError, TimeoutError) as exc:
        return Check("endpoint", False, f"{url} does not accept connections ({type(exc).__name__}: {exc}); "
                                        "start the agent first or fix endpoints.primary")
    writer.close()
    await writer.wait_closed()
    return Check("endpoint", True, f"{url} accepts connections")
