"""What the operator commands share (``agents``, ``resolve``, ``search``, ``watch``, ``token
revoke``): the node and token options, one HTTP client of the node's v1 API, the exit codes, and
how answers are printed — a table for people, ``--json`` for scripts.

Exit codes, the same for every operator command (:data:`EXIT_CODES`):

====  ==========================================================================================
 0    done
 1    the node answered with an error (4xx/5xx; the message is the node's, on stderr)
 2    usage: a missing or malformed option, no token
 3    the node cannot be reached (refused, timed out, not HTTP)
130   interrupted (Ctrl-C)
====  ==========================================================================================
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import orjson

from node.client import TOKEN_ENV, URL_ENV

from . import console
from .nodeurl import add_node_option, node_url
from .runtime import run

__all__ = ["EXIT_CODES", "EXIT_INTERRUPTED", "EXIT_NODE_ERROR", "EXIT_OK", "EXIT_UNREACHABLE", "EXIT_USAGE",
           "NodeAnswered", "NodeClient", "as_json", "OperatorError", "Unreachable", "UsageError", "add_operator_options",
           "exit_codes_epilog", "print_json", "print_table", "run_operator"]

EXIT_OK = 0
EXIT_NODE_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130
EXIT_CODES = {
    EXIT_OK: "done",
    EXIT_NODE_ERROR: "the node answered with an error (its message on stderr)",
    EXIT_USAGE: "usage: a missing or malformed option, no token",
    EXIT_UNREACHABLE: "the node cannot be reached",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}
DEFAULT_TIMEOUT_S = 10.0


def exit_codes_epilog() -> str:
    """The exit codes, as ``--help`` shows them."""
    return "exit codes: " + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items())


class OperatorError(Exception):
    """A command failed; ``exit_code`` says how (see :data:`EXIT_CODES`)."""

    exit_code = EXIT_NODE_ERROR


class UsageError(OperatorError):
    """The command line is incomplete or wrong."""

    exit_code = EXIT_USAGE


class Unreachable(OperatorError):
    """The node did not answer over HTTP."""

    exit_code = EXIT_UNREACHABLE


class NodeAnswered(OperatorError):
    """The node answered with an error status; ``body`` is its JSON error body, if any."""

    exit_code = EXIT_NODE_ERROR

    def __init__(self, message: str, *, status: int, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def add_operator_options(parser: argparse.ArgumentParser, *, json_help: str = "print the node's answer as JSON") -> None:
    """``--node``, ``--token``, ``--timeout-s`` and ``--json``."""
    add_node_option(parser)
    parser.add_argument("--token", help=f"bearer token (default ${TOKEN_ENV}); 'agent-reach token issue' prints one")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help=f"give up on the node after this long (default {DEFAULT_TIMEOUT_S:g} s)")
    parser.add_argument("--json", action="store_true", help=json_help)


class NodeClient:
    """The node's v1 API with one bearer token; ``async with NodeClient(url, token) as client``."""

    def __init__(self, url: str, token: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> NodeClient:
        self._session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {self.token}"})
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("use NodeClient as 'async with'")
        return self._session

    async def call(self, method: str, path: str, *, params: Sequence[tuple[str, str]] | None = None,
                   body: object = None) -> Any:
        """The decoded JSON answer; raises :class:`NodeAnswered` or :class:`Unreachable`."""
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        data = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else None
        try:
            async with self.session.request(method, self.url + path, params=params, data=data, headers=headers,
                                            timeout=timeout, allow_redirects=False) as response:
                raw = await response.read()
                return self._decoded(method, path, response.status, raw)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unreachable(self._unreachable(exc)) from exc

    async def events(self, path: str, *, params: Sequence[tuple[str, str]] | None = None,
                     ) -> AsyncIterator[tuple[str, Any]]:
        """The server-sent events of ``path`` as ``(event, data)`` until the node ends the stream."""
        timeout = aiohttp.ClientTimeout(total=None, connect=self.timeout_s, sock_connect=self.timeout_s)
        try:
            async with self.session.get(self.url + path, params=params, timeout=timeout,
                                        allow_redirects=False) as response:
                if response.status != 200:
                    self._decoded("GET", path, response.status, await response.read())
                fields: dict[str, str] = {}
                async for raw in response.content:
                    line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                    if line.startswith(":"):
                        continue
                    if line:
                        name, _, value = line.partition(":")
                        fields[name] = fields.get(name, "") + value.removeprefix(" ")
                        continue
                    if "data" in fields:
                        yield fields.get("event", "message"), orjson.loads(fields["data"])
                    fields = {}
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unreachable(self._unreachable(exc)) from exc

    def _decoded(self, method: str, path: str, status: int, raw: bytes) -> Any:
        try:
            decoded = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            decoded = None
        if status < 400:
            if decoded is None and raw:
                raise Unreachable(f"{self.url} answered {method} {path} with something that is not JSON; is it an "
                                  "Agent-Reach node?")
            return decoded
        if isinstance(decoded, dict) and "error" in decoded:
            where = f" (field {decoded['field']})" if decoded.get("field") else ""
            raise NodeAnswered(f"the node answered {status} {decoded['error']}{where}: {decoded.get('message', '')}",
                               status=status, body=decoded)
        raise NodeAnswered(f"the node answered {status} to {method} {path}", status=status)

    def _unreachable(self, exc: BaseException) -> str:
        reason = str(exc) or type(exc).__name__
        if isinstance(exc, TimeoutError):
            reason = f"no answer within {self.timeout_s:g} s"
        return f"cannot reach the node at {self.url}: {reason} (is it running? see --node, ${URL_ENV})"


def token_of(args: argparse.Namespace) -> str:
    """``--token``, else ``$AGENT_REACH_TOKEN``; raises :class:`UsageError` without either."""
    token = (args.token or os.environ.get(TOKEN_ENV, "")).strip()
    if not token:
        raise UsageError(f"give --token or set ${TOKEN_ENV} (e.g. 'agent-reach token issue --admin')")
    return token


def run_operator(args: argparse.Namespace, command: Callable[[NodeClient], Awaitable[int | None]]) -> int:
    """Run ``command`` with a client of the node the options name; errors become exit codes."""
    try:
        token = token_of(args)
        url = node_url(args.node)

        async def main() -> int | None:
            async with NodeClient(url, token, timeout_s=args.timeout_s) as client:
                return await command(client)

        return int(run(main()) or EXIT_OK)
    except OperatorError as exc:
        console.error(console.shown(exc))  # one line: a node's message may quote what others sent it
        return exc.exit_code
    except (KeyboardInterrupt, asyncio.CancelledError):
        return EXIT_INTERRUPTED


def print_json(value: object) -> None:
    """One JSON document on stdout (scripts parse it; keys as the node sent them)."""
    sys.stdout.write(console.json_text(value, indent=True) + "\n")
    sys.stdout.flush()


def as_json(args: argparse.Namespace, answer: object) -> bool:
    """With ``--json``: print ``answer`` as JSON and say so (the caller prints nothing else)."""
    if args.json:
        print_json(answer)
    return bool(args.json)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, empty: str = "(none)") -> None:
    """Aligned columns for people, each cell :func:`console.shown`; ``empty`` when there is no row."""
    if not rows:
        print(empty)
        return
    cells = [[console.shown(value) for value in row] for row in rows]
    widths = [max(len(headers[i]), *(len(row[i]) for row in cells)) for i in range(len(headers))]
    for row in [list(headers), *cells]:
        print("  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip())
