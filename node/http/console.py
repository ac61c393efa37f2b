"""The web console at ``/ui``: static files shipped in the package (``node/http/ui/``), no build step.

The console is plain HTML, CSS and JavaScript that talks to this node's v1 API with the bearer
token the operator gives it (kept in the tab's ``sessionStorage``), so it shows exactly what that
token may see. Its files are public, its data is not. A link may carry the token in the URL
fragment (``/ui/#token=…``: never sent to a server); the page reads it once into
``sessionStorage`` and removes it from the address bar.

What is served, and how:

* only the files in ``node/http/ui/`` read when the app is built (:class:`ConsoleFiles`): a request
  names a file of that table or gets a 404, so no path reaches the file system (no traversal);
* ``Content-Security-Policy`` without inline scripts or styles (``'self'`` only; no other origin,
  no framing), ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer``;
* ``index.html`` is never cached (``no-store``); the other files carry a strong ``ETag`` and
  ``no-cache``, so a browser revalidates them and gets ``304`` while they are unchanged.

``/`` and ``/ui`` redirect to ``/ui/``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from ..core import NotFound

__all__ = ["CONSOLE_PREFIX", "CONSOLE_ROUTES", "ConsoleFiles", "SECURITY_HEADERS", "console_files", "console_link",
           "install_console", "is_console_path"]

CONSOLE_PREFIX = "/ui"
UI_DIR = Path(__file__).resolve().parent / "ui"
_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
CONSOLE_ROUTES = ("/", CONSOLE_PREFIX, f"{CONSOLE_PREFIX}/", f"{CONSOLE_PREFIX}/{{name}}")
"""The console's routes (public, like its files; documented in ``node.http.openapi``)."""


@dataclass(frozen=True, slots=True)
class StaticFile:
    body: bytes
    content_type: str
    etag: str


class ConsoleFiles:
    """The console's files by name, read once; nothing outside this table is ever served."""

    INDEX = "index.html"

    def __init__(self, directory: Path = UI_DIR) -> None:
        self.files: dict[str, StaticFile] = {}
        for path in sorted(directory.iterdir()):
            content_type = _CONTENT_TYPES.get(path.suffix)
            if not path.is_file() or content_type is None:
                continue
            body = path.read_bytes()
            self.files[path.name] = StaticFile(body=body, content_type=content_type,
                                               etag=f'"{hashlib.sha256(body).hexdigest()[:32]}"')
        if self.INDEX not in self.files:
            raise RuntimeError(f"the console's {self.INDEX} is missing from {directory}: reinstall agent-reach")

    def response(self, name: str, request: web.Request) -> web.Response:
        """The file ``name`` (or 304 when the browser holds it); raises :class:`NotFound`."""
        found = self.files.get(name)
        if found is None:
            raise NotFound(f"the console has no file {name!r}", code="not_found")
        headers = {**SECURITY_HEADERS, "Content-Type": found.content_type}
        if name == self.INDEX:
            headers["Cache-Control"] = "no-store"
            return web.Response(body=found.body, headers=headers)
        headers.update({"Cache-Control": "no-cache", "ETag": found.etag})
        if found.etag in _etags(request.headers.get("If-None-Match", "")):
            return web.Response(status=304, headers=headers)
        return web.Response(body=found.body, headers=headers)


def _etags(header: str) -> set[str]:
    return {tag.strip().removeprefix("W/") for tag in header.split(",") if tag.strip()}


def console_files(directory: Path = UI_DIR) -> list[str]:
    """The names under ``/ui/`` (the page itself is ``/ui/``), sorted; for the API document."""
    return sorted(name for name in ConsoleFiles(directory).files if name != ConsoleFiles.INDEX)


def is_console_path(path: str) -> bool:
    """Whether ``path`` is one of the console's (public) routes."""
    return path == "/" or path == CONSOLE_PREFIX or path.startswith(f"{CONSOLE_PREFIX}/")


def console_link(node_url: str, token: str | None = None) -> str:
    """The console of the node at ``node_url``, signed in with ``token`` when given (in the fragment)."""
    base = f"{node_url.rstrip('/')}{CONSOLE_PREFIX}/"
    return f"{base}#token={token}" if token else base


def install_console(app: web.Application, files: ConsoleFiles | None = None) -> None:
    """Add the console's routes to ``app``."""
    console = files or ConsoleFiles()

    async def to_console(request: web.Request) -> web.Response:
        # A relative Location keeps the scheme and host the browser used (behind a proxy too);
        # the browser carries the fragment (#token=…) over to the new address.
        return web.Response(status=302, headers={**SECURITY_HEADERS, "Location": f"{CONSOLE_PREFIX}/"})

    async def index(request: web.Request) -> web.Response:
        return console.response(ConsoleFiles.INDEX, request)

    async def static(request: web.Request) -> web.Response:
        return console.response(request.match_info["name"], request)

    app.router.add_get("/", to_console)
    app.router.add_get(CONSOLE_PREFIX, to_console)
    app.router.add_get(f"{CONSOLE_PREFIX}/", index)
    app.router.add_get(f"{CONSOLE_PREFIX}/{{name}}", static)
