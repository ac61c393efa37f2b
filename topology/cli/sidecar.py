"""``agent-reach sidecar --config agent.toml``: put an existing HTTP agent on the reach layer.

For agents that cannot embed the SDK. The sidecar runs beside the agent and, with the SDK's
:class:`~node.client.ReachClient`:

* with ``[sidecar] upstream``, stands on the call path (:mod:`topology.cli.gateway`): listens
  where the agent is registered, verifies each call's route credential (401 without one or with
  an expired one, 403 for another agent's or a caller outside ``allowed_callers``) and forwards
  what passes to the agent, naming the caller in ``X-Reach-Caller``; without it, calls go to the
  agent directly, which must then verify them itself (``node.client.CallVerifier``);
* runs preflight (unless ``--skip-preflight``) and exits 1 with the reason if it fails;
* probes the agent's ``/healthz`` and ``/readyz`` (``[sidecar]`` URLs, interval, thresholds);
* registers it — as ``unready`` if it is not ready yet: alive ≠ ready;
* heartbeats with its load: a JSON ``/readyz`` body with ``queued``/``inflight``/``rps`` is
  passed on as the agent's load;
* after ``failure_threshold`` consecutive failed probes marks it ``unready`` at once (the
  heartbeat is pushed immediately), which takes it out of routing; after ``success_threshold``
  consecutive successes marks it ``ready`` again (hysteresis: one lost probe does not flap);
* deregisters it when the sidecar stops (SIGINT/SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import logging
import signal
from typing import Any

import aiohttp
import orjson

from node.client import (
    AgentConfig,
    AgentConfigError,
    CallVerifier,
    Load,
    NodeError,
    ReachClient,
    Status,
    load_agent_config,
)

from .gateway import Gateway, listen_address
from .nodeurl import add_node_option, node_url_of
from .preflight import run_preflight

log = logging.getLogger(__name__)


class SidecarState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    CLOSED = "closed"


class Sidecar:
    """Registers, probes and heartbeats for one plain HTTP agent; an async context manager."""

    def __init__(self, config: AgentConfig) -> None:
        if config.agent is None:
            raise AgentConfigError("the sidecar needs an [agent] section to register", field="agent")
        self.config = config
        self.settings = config.sidecar
        self.health_url, self.ready_url = config.sidecar_urls()
        self.client = ReachClient(config=config, load=lambda: self._load)
        self.gateway: Gateway | None = None
        if self.settings.upstream is not None:
            agent = config.agent
            self.gateway = Gateway(
                verifier=CallVerifier(self.client.node_url, agent_id=agent.agent_id,
                                      allowed_callers=agent.allowed_callers, ssl_context=self.client.ssl_context),
                upstream=self.settings.upstream, listen=listen_address(agent.endpoints["primary"], self.settings.listen),
                max_body_bytes=self.settings.max_body_bytes, timeout_s=config.client.read_timeout_ms / 1000,
                status=lambda: (self._failures < self.settings.failure_threshold, self.status is Status.READY),
                ssl_context=self.client.ssl_context)
        self.state = SidecarState.NEW
        self.status = Status.UNREADY
        self.probes_run = 0
        self._load: Load | None = None
        self._failures = 0
        self._successes = 0
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Sidecar:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        if self.state is not SidecarState.NEW:
            return
        self.state = SidecarState.RUNNING
        try:
            # the agent's probes trust what the client trusts ([client] ca_file): an https agent's private CA
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.client.ssl_context))
            healthy = await self._probe_once()
            self.status = Status.READY if healthy else Status.UNREADY
            self._successes = self.settings.success_threshold if healthy else 0
            self._failures = 0 if healthy else self.settings.failure_threshold
            self.client.set_status(self.status, push=False)
            if self.gateway is not None:  # listening before registering: the node sends callers at once
                await self.gateway.start()
            await self.client.start()
            self._task = asyncio.get_running_loop().create_task(self._probe_loop(), name="sidecar-probes")
            self._task.add_done_callback(self._probe_loop_done)
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Stop probing and deregister the agent. Idempotent."""
        if self.state is SidecarState.CLOSED:
            return
        self.state = SidecarState.CLOSED
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.client.aclose()
        if self.gateway is not None:
            await self.gateway.aclose()
        if self._session is not None:
            await self._session.close()

    def _probe_loop_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("the sidecar's probe loop died: %r; the agent's status is frozen", task.exception())

    async def _probe_loop(self) -> None:
        interval_s = self.settings.probe_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            healthy = await self._probe_once()
            if healthy:
                self._successes += 1
                self._failures = 0
                if self.status is not Status.READY and self._successes >= self.settings.success_threshold:
                    self._flip(Status.READY)
            else:
                self._failures += 1
                self._successes = 0
                if self.status is Status.READY and self._failures >= self.settings.failure_threshold:
                    self._flip(Status.UNREADY)

    def _flip(self, status: Status) -> None:
        log.info("%s is now %s", self.config.agent.agent_id if self.config.agent else "agent", status.value)
        self.status = status
        self.client.set_status(status, push=True)

    async def _probe_once(self) -> bool:
        """Alive and ready; records the load the readiness body reports."""
        self.probes_run += 1
        alive, _ = await self._get(self.health_url)
        if not alive:
            return False
        ready, body = await self._get(self.ready_url)
        if ready:
            self._load = _load_from(body)
        return ready

    async def _get(self, url: str) -> tuple[bool, Any]:
        session = self._session
        if session is None:
            return False, None
        timeout = aiohttp.ClientTimeout(total=self.settings.probe_timeout_ms / 1000)
        try:
            async with session.get(url, timeout=timeout) as response:
                raw = await response.read()
                ok = 200 <= response.status < 300
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.debug("probe %s failed: %r", url, exc)
            return False, None
        try:
            return ok, orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            return ok, None


def _load_from(body: Any) -> Load | None:
    if not isinstance(body, dict):
        return None
    fields = {key: body[key] for key in ("queued", "inflight", "rps") if isinstance(body.get(key), (int, float))}
    if not fields:
        return None
    try:
        return Load.model_validate(fields)
    except ValueError:
        return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``sidecar``'s options, on the parser :mod:`.entrypoint` made for it."""
    parser.add_argument("--config", required=True, help="the agent TOML file (see README: 'The agent TOML')")
    add_node_option(parser)
    parser.add_argument("--skip-preflight", action="store_true", help="start without checking the config first")
    parser.set_defaults(func=lambda args: asyncio.run(main(args)))


async def main(args: argparse.Namespace) -> int:
    try:
        config = node_url_of(load_agent_config(args.config), args.node)
    except AgentConfigError as exc:
        print(f"sidecar: {exc.message}", flush=True)
        return 2
    if not args.skip_preflight:
        checks = await run_preflight(config)
        failed = [check for check in checks if not check.ok]
        if failed:
            for check in checks:
                print(check.line(), flush=True)
            print(f"sidecar: not starting: {failed[0].name}: {failed[0].detail}", flush=True)
            return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with Sidecar(config) as sidecar:
            agent_id = config.agent.agent_id if config.agent else "?"
            registered = sidecar.client.registered
            print(f"sidecar: registered {agent_id} at {config.node.url} (region "
                  f"{registered.region if registered else '?'}) as {sidecar.status.value}; probing "
                  f"{sidecar.health_url} and {sidecar.ready_url}", flush=True)
            if sidecar.gateway is not None:
                host, port = sidecar.gateway.listen
                print(f"sidecar: verifying calls on {host}:{port} and forwarding them to "
                      f"{sidecar.settings.upstream}", flush=True)
            else:
                print("sidecar: calls go to the agent directly (no [sidecar] upstream): it must verify their "
                      "route credentials itself", flush=True)
            await stop.wait()
            print(f"sidecar: stopping; deregistering {agent_id}", flush=True)
    except NodeError as exc:
        print(f"sidecar: {exc.code}: {exc.message}", flush=True)
        return 1
    except OSError as exc:  # the gateway's address is taken
        print(f"sidecar: cannot listen for calls: {exc.strerror or exc}", flush=True)
        return 1
    return 0
