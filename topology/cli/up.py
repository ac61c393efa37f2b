"""``agent-reach up [FILE]``: run a whole topology on this machine, supervised, until Ctrl-C.

Runs :class:`~topology.launcher.LocalCluster`: embedded Redis and Kafka where the topology
names none, one node process per region, each child restarted if it dies on its own (one line
on stderr says what died). The embedded Redis data is kept in ``--data-dir`` (default
``~/.agent-reach/up/<topology name>/<region>/redis``) unless ``--ephemeral``.

Ports: the topology's node URLs, or free ports with ``--any-port`` — also chosen, said in one
line, when a node's port is taken. Either way the URLs are written, with where the secret comes
from and an admin token, to ``~/.agent-reach/local.json`` while ``up`` runs
(:func:`~topology.launcher.published_cluster`), where the SDK and the command line on this
machine find the first region's node without ``$AGENT_REACH_URL``.

Each node is waited for as long as its process runs — on a busy machine, importing and loading
the model can take minutes — with a line on stderr every few seconds saying what it is doing
(``waiting for region us-east (http://127.0.0.1:7101): loading the model… 12 s``); a node that
exits while starting is reported at once. ``--start-timeout-s N`` gives up on a node not ready
after N s instead.

Ctrl-C (or SIGTERM) at any moment — while starting, while the demo starts, while running —
stops everything within a few seconds: demo agents, then nodes (SIGTERM, SIGKILL after
:data:`UP_NODE_STOP_TIMEOUT_S`), then the broker and Redis. Exit status: 0 after a stop
while running, 130 when interrupted while starting, 1 when something could not start, 2 for
an unusable topology file or secret.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from pathlib import Path

from node.client import LOCAL_CLUSTER_FILE
from node.core import NodeError
from node.http import console_link
from node.trust import SecretError, load_secret

from ..demo import Demo, DemoError, start_demo
from ..embedded import default_up_data_dir
from ..launcher import LauncherError, LocalCluster, busy_node_port, published_cluster
from ..spec import DEFAULT_TOPOLOGY_FILE, Topology, TopologyError, load_topology
from . import console
from .options import add_log_format_option, add_secret_options, add_storage_options
from .signals import Interrupted, StopSignals
from .tokens import admin_token_line

__all__ = ["UP_DEMO_STOP_TIMEOUT_S", "UP_NODE_DRAIN_TIMEOUT_MS", "UP_NODE_STOP_TIMEOUT_S", "UP_SERVICE_STOP_TIMEOUT_S",
           "add_arguments"]

# Ctrl-C must leave nothing running within 5 s: these bound each stage of the stop (demo
# agents, then nodes in parallel, then the embedded servers in parallel). A node's stop can
# outlast its drain when a model thread is busy encoding; SIGKILL loses nothing there (the
# data is in Redis).
UP_DEMO_STOP_TIMEOUT_S = 1.0
UP_NODE_STOP_TIMEOUT_S = 2.5
UP_NODE_DRAIN_TIMEOUT_MS = 500
UP_SERVICE_STOP_TIMEOUT_S = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``up``'s options, on the parser :mod:`.entrypoint` made for it."""
    parser.add_argument("file", nargs="?", default=None,
                        help=f"topology file (default: the packaged {DEFAULT_TOPOLOGY_FILE.name}, three regions)")
    parser.add_argument("--any-port", action="store_true",
                        help="listen on free ports instead of the topology's node URLs (also chosen when one of "
                             f"those is taken); clients on this machine find them in {LOCAL_CLUSTER_FILE}")
    parser.add_argument("--log-dir", metavar="DIR", help="keep node logs here (default: a temporary directory "
                                                         "removed on exit)")
    add_log_format_option(parser)
    add_storage_options(parser, data_dir_help="keep the embedded Redis data here, one subdirectory per region "
                                              "(default: ~/.agent-reach/up/<topology name>)")
    add_secret_options(parser)
    parser.add_argument("--start-timeout-s", type=_positive_seconds, default=None, metavar="N",
                        help="stop everything when a node is not ready N seconds after it was started (default: "
                             "no deadline; wait as long as the node runs, saying every few seconds what it is doing)")
    parser.add_argument("--demo", action="store_true", help="also start the demo agents (topology.demo) in different "
                                                            "regions and show a local and a cross-region call")
    parser.set_defaults(func=_run)


def _positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not seconds > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return seconds


def _run(args: argparse.Namespace) -> int:
    try:
        topology = load_topology(args.file)
        secret, source = load_secret(secret_file=args.secret_file, create=args.create_secret)
    except (TopologyError, SecretError) as exc:
        console.error(str(exc))
        return 2
    if args.ephemeral:
        data_dir = None
    else:
        data_dir = Path(args.data_dir).expanduser() if args.data_dir else default_up_data_dir(topology.name)
    try:
        return asyncio.run(_main(args, topology, secret=secret, source=source, data_dir=data_dir))
    except KeyboardInterrupt:  # before the handlers were installed: nothing was started yet
        return 130


async def _main(args: argparse.Namespace, topology: Topology, *, secret: bytes, source: str,
                data_dir: Path | None) -> int:
    any_port = args.any_port
    # The packaged topology's ports are a convenience, so others are taken when they are busy; a
    # topology file's ports are its author's: a busy one stays an error that names it.
    if not any_port and args.file is None and (busy := busy_node_port(topology)) is not None:
        console.say(f"agent-reach up: {busy}; listening on free ports instead (clients on this machine find them "
                    f"in {LOCAL_CLUSTER_FILE})")
        any_port = True
    async with StopSignals() as signals:
        published = contextlib.ExitStack()
        cluster = LocalCluster(topology, secret=secret, any_port=any_port,
                               run_dir=Path(args.log_dir) if args.log_dir else None, data_dir=data_dir,
                               log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()),
                               log_format=args.log_format,
                               say=lambda line: console.notice(f"agent-reach up: {line}"),
                               node_start_timeout_s=args.start_timeout_s,
                               node_stop_timeout_s=UP_NODE_STOP_TIMEOUT_S,
                               node_drain_timeout_ms=UP_NODE_DRAIN_TIMEOUT_MS,
                               service_stop_timeout_s=UP_SERVICE_STOP_TIMEOUT_S)
        demo: Demo | None = None
        try:
            try:
                await signals.run(cluster.start())
            except Interrupted:
                console.say("agent-reach up: interrupted while starting; stopping everything")
                return 130
            except TopologyError as exc:  # a node or service did not start, the data dir is unusable
                console.error(str(exc))
                return 1
            console.say(f"agent-reach up: topology {topology.name!r} is running ({len(cluster.nodes)} regions)")
            console.say(cluster.summary())
            console.say(f"  data {data_dir if data_dir is not None else '(ephemeral: removed on exit)'}")
            console.say(f"  secret {source}")
            admin_token = cluster.admin_token()
            console.say(admin_token_line(admin_token))
            try:
                where = published.enter_context(published_cluster(
                    topology=topology.name, nodes={name: cluster.url(name) for name in cluster.nodes},
                    secret=source, admin_token=admin_token))
            except LauncherError as exc:
                console.error(str(exc))
                return 1
            console.say(f"  clients on this machine find these URLs and the token in {where} while up runs")
            for name in cluster.nodes:  # signed in: the token rides in the fragment, never sent to a server
                console.say(f"  console {name}  {console_link(cluster.url(name), admin_token)}")
            if args.demo:
                try:
                    demo = await signals.run(_start_demo(cluster))
                except Interrupted:
                    console.say("agent-reach up: interrupted while the demo started; stopping everything")
                    return 130
                except LauncherError as exc:
                    console.error(str(exc))
                    return 1
            console.say("Ctrl-C stops everything; children that die are restarted.")
            try:
                failure = await signals.run(cluster.supervisor.wait_failed())
            except Interrupted:
                console.say("agent-reach up: stopping")
                return 0
            console.error(f"supervision failed ({failure!r}); stopping everything")
            return 1
        finally:
            published.close()  # clients stop being sent here first
            if demo is not None:
                await demo.aclose(stop_timeout_s=UP_DEMO_STOP_TIMEOUT_S)
            await cluster.aclose()
            console.say("agent-reach up: stopped")


async def _start_demo(cluster: LocalCluster) -> Demo:
    """The demo agents of :mod:`topology.demo`, one region each.

    Raises LauncherError when the demo cannot start or its calls fail.
    """
    try:
        return await start_demo({name: cluster.url(name) for name in cluster.nodes}, cluster.admin_token(),
                                stop_timeout_s=UP_DEMO_STOP_TIMEOUT_S)
    except (DemoError, NodeError) as exc:
        raise LauncherError(f"the demo failed: {exc}") from exc
