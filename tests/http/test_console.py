"""The console's files over HTTP: public, served from the package only (no path reaches the file
system), with a CSP that allows no inline script, nosniff, index never cached, the rest by
ETag; and the API routes the console reads keep an agent restricted by ``allowed_callers``
from another caller's token (the console shows what its token may see, nothing more)."""

from __future__ import annotations

import aiohttp
import pytest
from multidict import CIMultiDict
from yarl import URL

from node.core.models import Outcome, TokenRole
from node.http import console_link
from node.http.console import UI_DIR, ConsoleFiles, is_console_path

from ..helpers import RunningNode, Watcher, registration, wait_for


async def _get(node: RunningNode, path: str, **headers: str) -> tuple[int, CIMultiDict[str], bytes]:
    async with node.session.get(path, headers=headers, allow_redirects=False) as response:
        return response.status, response.headers.copy(), await response.read()


async def test_the_console_is_public_static_and_sent_with_security_headers(node: RunningNode) -> None:
    status, headers, body = await _get(node, "/ui/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b'<script src="app.js"' in body and b"<script>" not in body  # no inline script
    csp = headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "'unsafe-inline'" not in csp and "frame-ancestors 'none'" in csp
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["Referrer-Policy"] == "no-referrer"
    assert headers["Cache-Control"] == "no-store" and "ETag" not in headers

    status, headers, body = await _get(node, "/ui/app.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript")
    assert body == (UI_DIR / "app.js").read_bytes()
    assert headers["Cache-Control"] == "no-cache" and headers["ETag"].startswith('"')
    assert "Content-Security-Policy" in headers
    status, again, body = await _get(node, "/ui/app.js", **{"If-None-Match": headers["ETag"]})
    assert status == 304 and body == b"" and again["ETag"] == headers["ETag"]
    status, _, body = await _get(node, "/ui/app.css", **{"If-None-Match": '"stale"'})
    assert status == 200 and body

    for path in ("/", "/ui"):
        status, headers, _ = await _get(node, path)
        assert status == 302 and headers["Location"] == "/ui/", path


@pytest.mark.parametrize("path", ["/ui/../node/api.py", "/ui/..%2fconsole.py", "/ui/%2e%2e/console.py",
                                  "/ui/..%2f..%2fpyproject.toml", "/ui/app.js%00", "/ui/.%2fapp.js",
                                  "/ui/app.js/", "/ui/%2Fetc%2Fpasswd", "/ui/console.py", "/ui/nothing.js"])
async def test_no_path_reaches_the_file_system(node: RunningNode, path: str) -> None:
    async with aiohttp.ClientSession() as session:  # as sent: no client-side normalisation
        async with session.get(URL(node.url + path, encoded=True), allow_redirects=False) as response:
            body = await response.read()
    assert response.status in (404, 400), (path, response.status)
    assert b"import" not in body and b"root:" not in body and b"[project]" not in body


@pytest.mark.unit
def test_the_table_of_files_is_what_the_package_ships() -> None:
    files = ConsoleFiles()
    assert {"index.html", "app.js", "app.css", "favicon.svg"} <= set(files.files)
    assert all(name == path.name for name, path in ((n, UI_DIR / n) for n in files.files))
    assert is_console_path("/ui/app.js") and is_console_path("/") and not is_console_path("/uix")
    assert console_link("http://127.0.0.1:7101/", "ar1.x.y") == "http://127.0.0.1:7101/ui/#token=ar1.x.y"


async def test_what_the_console_reads_hides_a_restricted_agent_from_another_caller(node: RunningNode) -> None:
    await node.register(registration("ops.secret.keeper", capability="vault.open", allowed_callers=["ops.*.*"]))
    await node.register(registration("lang.translate.public", capability="translate.text"))
    outsider = node.token("sales.crm.viewer", TokenRole.CALLER)
    insider = node.token("ops.console.viewer", TokenRole.CALLER)

    def listed(token: str) -> set[str]:
        return {record["agent_id"] for record in listed_bodies[token]["agents"]}

    listed_bodies = {}
    for token in (outsider, insider, node.admin_token):
        status, listed_bodies[token] = await node.call("GET", "/v1/agents?scope=global", token=token)
        assert status == 200
    assert listed(outsider) == {"lang.translate.public"}
    assert listed(insider) == listed(node.admin_token) == {"lang.translate.public", "ops.secret.keeper"}
    status, body = await node.call("GET", "/v1/agents/ops.secret.keeper", token=outsider)
    assert status == 404 and body["error"] == "unknown_agent"
    status, _ = await node.call("GET", "/v1/agents/ops.secret.keeper/agent-card.json", token=outsider)
    assert status == 404

    # The console's live feed: the outsider's stream never carries the restricted agent.
    async with Watcher(node.session, "/v1/watch", outsider) as outsider_watch, \
            Watcher(node.session, "/v1/watch", insider) as insider_watch:
        await node.register(registration("ops.secret.keeper", capability="vault.open", allowed_callers=["ops.*.*"],
                                         description="changed"))
        await node.register(registration("lang.translate.public2", capability="translate.text"))
        await wait_for(lambda: "lang.translate.public2" in outsider_watch.agent_ids(), message="the outsider's event")
        await wait_for(lambda: "ops.secret.keeper" in insider_watch.agent_ids(), message="the insider's event")
        assert "ops.secret.keeper" not in outsider_watch.agent_ids()


async def test_breakers_show_what_outcome_reports_opened_to_those_who_may_see_the_agent(node: RunningNode) -> None:
    await node.register(registration("ops.flaky.worker", capability="flaky.job", allowed_callers=["ops.*.*"]))
    insider = node.token("ops.console.viewer", TokenRole.CALLER)
    outsider = node.token("sales.crm.viewer", TokenRole.CALLER)
    for reporter in (insider, node.token("ops.console.other", TokenRole.CALLER)):  # one caller alone cannot
        status, ticket = await node.resolve(token=reporter, capability="flaky.job")
        assert status == 200
        reports = [{"agent_id": "ops.flaky.worker", "signature": ticket["signature"],
                    "outcome": Outcome.FAILURE.value}] * ((node.node.config.breaker_failures + 1) // 2)
        status, _ = await node.call("POST", "/v1/reports", json={"reports": reports}, token=reporter)
        assert status == 200
    status, body = await node.call("GET", "/v1/breakers", token=insider)
    assert status == 200 and body["node_id"] == node.node.node_id
    assert [(b["agent_id"], b["state"]) for b in body["breakers"]] == [("ops.flaky.worker", "open")]
    assert 0 < body["breakers"][0]["error_factor"] < 1
    status, body = await node.call("GET", "/v1/breakers", token=outsider)
    assert status == 200 and body["breakers"] == []
