"""A command imports what it uses: ``agent-reach --version`` and the operator commands start
without the node's server, federation, Kafka or the model (``topology.cli.entrypoint``), each in
a fresh interpreter; and the names the command line states to start fast are node's own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

# What no light command may load: the composition root and what only it or a node needs.
HEAVY = ("federation", "aiokafka", "semantic", "torch", "sentence_transformers", "redis", "topology.composition",
         "aiohttp.web")
# What the parser alone does not need either: it stays close to a bare interpreter.
NOT_FOR_THE_PARSER = (*HEAVY, "node", "pydantic", "aiohttp")

PARSED = [
    ["agents", "list"],
    ["agents", "get", "a.b.c"],
    ["token", "issue", "--admin"],
    ["token", "revoke", "--jti", "j", "--exp", "1"],
    ["resolve", "translate.text"],
    ["search", "plain", "words"],
    ["watch"],
    ["acl", "list"],
    ["acl", "set", "deny-shop", "--agents", "fin.*.*", "--callers", "shop.*.*"],
]


def _loaded(probe: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``probe`` (which may print nothing)."""
    code = f"import sys\n{probe}\nprint('\\n'.join(sorted(sys.modules)))\n"
    env = {name: value for name, value in os.environ.items() if not name.startswith("AGENT_REACH_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def _of(loaded: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(name for name in loaded if name in packages or name.startswith(tuple(f"{p}." for p in packages)))


def test_version_loads_nothing_but_the_parser() -> None:
    loaded = _loaded(
        "import contextlib, io\n"
        "from topology.cli.entrypoint import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):\n"
        "    main(['--version'])\n"
        "assert out.getvalue().startswith('agent-reach '), out.getvalue()\n"
    )
    assert not _of(loaded, NOT_FOR_THE_PARSER), _of(loaded, NOT_FOR_THE_PARSER)
    assert "topology.cli.entrypoint" in loaded and not _of(loaded, ("topology.cli.agents", "topology.cli.node"))


@pytest.mark.parametrize("argv", PARSED, ids=" ".join)
def test_the_parser_of_an_operator_command_loads_no_node_federation_or_model(argv: list[str]) -> None:
    loaded = _loaded(
        "from topology.cli.entrypoint import build_parser\n"
        f"args = build_parser().parse_args({argv!r})\n"
        "assert callable(args.func)\n"
    )
    assert not _of(loaded, NOT_FOR_THE_PARSER), _of(loaded, NOT_FOR_THE_PARSER)
    assert not _of(loaded, ("topology.cli.node", "topology.cli.up", "topology.cli.sidecar")), sorted(loaded)


def test_an_operator_command_against_a_dead_node_loads_no_server_federation_or_model() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    loaded = _loaded(
        "import contextlib, io\n"
        "from topology.cli.entrypoint import main\n"
        "with contextlib.redirect_stderr(io.StringIO()) as err:\n"
        f"    code = main(['agents', 'list', '--node', 'http://127.0.0.1:{port}', '--token', 'x'])\n"
        "assert code == 3 and 'cannot reach the node' in err.getvalue(), (code, err.getvalue())\n"
    )
    # one request needs neither aiohttp nor an event loop: the standard library's client asks
    assert not _of(loaded, (*HEAVY, "pydantic", "aiohttp", "asyncio")), _of(loaded, (*HEAVY, "pydantic", "aiohttp",
                                                                                   "asyncio"))
    assert "http.client" in loaded  # it did try the node


@pytest.mark.unit
def test_the_names_stated_for_a_fast_start_are_node_s_own() -> None:
    from node.client import TOKEN_ENV, URL_ENV
    from node.core import CA_FILE_ENV, CLIENT_CERT_FILE_ENV, CLIENT_KEY_FILE_ENV
    from node.core.models import NOT_IN_ONE_LINE
    from node.ops import LOG_FORMATS
    from node.trust import DEFAULT_TOKEN_TTL_S
    from topology.cli import nodenames, nodeurl
    from topology.spec import DEFAULT_TOPOLOGY_FILE, load_topology

    assert (nodenames.LOG_FORMATS, nodenames.TOKEN_ENV, nodenames.URL_ENV, nodenames.DEFAULT_TOKEN_TTL_S,
            nodenames.NOT_IN_ONE_LINE) == (LOG_FORMATS, TOKEN_ENV, URL_ENV, DEFAULT_TOKEN_TTL_S, NOT_IN_ONE_LINE)
    assert nodenames.TLS_ENV == (CA_FILE_ENV, CLIENT_CERT_FILE_ENV, CLIENT_KEY_FILE_ENV)
    assert nodeurl._PACKAGED_TOPOLOGY.resolve() == DEFAULT_TOPOLOGY_FILE.resolve()
    assert nodeurl.local_node_url() == load_topology().regions[0].node_urls[0].rstrip("/")


@pytest.mark.unit
def test_every_command_of_the_table_gets_its_options_when_looked_up() -> None:
    from topology.cli.entrypoint import COMMANDS, build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0]  # type: ignore[union-attr]
    assert list(commands.choices) == [command.name for command in COMMANDS]
    overview = " ".join(parser.format_help().split())  # as one line, however the help was wrapped
    for command in COMMANDS:
        assert f"{command.name} {command.help}" in overview, command.name
        help_text = commands.choices[command.name].format_help()
        assert help_text.startswith(f"usage: agent-reach {command.name} [-h] "), (command.name, help_text)
