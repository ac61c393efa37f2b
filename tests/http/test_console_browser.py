"""The console in a real browser: headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
which ``make test`` installs when missing) driven by Selenium against a live node.

Signed in by the link ``agent-reach up`` prints (the token in the fragment, taken out of the
address bar), an agent registered while the page is open appears without a reload (the watch),
a search shows the expected agent first with its score and what matched, an agent's page shows
its card and this node's route decision, and another caller's token does not see an agent
restricted to others. Screenshots go to the test's folder; with ``AGENT_REACH_UPDATE_SCREENSHOT=1``
the agents view is copied to ``docs/console.png`` (the README shows it). Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from node.config import NodeConfig
from node.core.models import TokenRole
from node.service import RegistryNode
from topology.composition import attach_discovery

from ..conftest import TEST_SECRET
from ..helpers import RunningNode, registration, start_node

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
WAIT_S = 20
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "console.png"

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # pragma: no cover - the dev extra installs it
    webdriver = None

pytestmark = pytest.mark.skipif(
    webdriver is None or not CHROMIUM or not CHROMEDRIVER,
    reason="headless Chromium is not installed (apt-get install chromium chromium-driver; make test does)")

AGENTS = [
    ("lang.translate.deepl_eu", "Translator", "Translates contracts, letters and web pages between European languages",
     "translate.text", "2", "ready", {"team": "lang"}),
    ("docs.ocr.tesseract", "OCR", "Reads the text of scanned images and PDF files", "ocr.image", "1", "degraded",
     {"team": "docs"}),
    ("search.images.clip", "Image search", "Finds photos and drawings matching a description", "search.images", "1",
     "ready", {"team": "vision"}),
    ("finance.risk.scorer", "Risk scorer", "Scores the fraud risk of a card payment", "payment.risk_check", "3",
     "busy", {"team": "payments"}),
]


@pytest.fixture
async def console_node(redis_url: str, region: str) -> AsyncIterator[RunningNode]:
    # A region name as an operator would see it; the test's own key prefix keeps it apart in the shared Redis.
    config = NodeConfig(region="eu-west", key_prefix=f"console-{region}", redis_url=redis_url, port=0,
                        sweep_interval_ms=100, lease_sync_interval_ms=100, leader_ttl_ms=1_000,
                        egress={"allow": ["loopback"]})
    node = RegistryNode(config, secret=TEST_SECRET)
    attach_discovery(node, semantic_enabled=False)
    running = await start_node(node)
    yield running
    await running.aclose()


def _call(url: str, token: str, method: str, path: str, body: object = None) -> object:
    """The node's API from the browser's thread (the test's loop serves the node meanwhile)."""
    request = urllib.request.Request(url + path, method=method, data=json.dumps(body).encode() if body else None,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _agent(agent_id: str, name: str, description: str, capability: str, version: str, status: str,
           labels: dict[str, str], **extra: object) -> dict[str, object]:
    body = registration(agent_id, capability=capability, version=version, description=description,
                        display_name=name, status=status, labels=labels, lease_ttl_ms=600_000, max_concurrency=8,
                        **extra)
    body["capabilities"][0]["description"] = description
    return body


def _browser() -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1400,860", "--no-first-run", "--disable-extensions"):
        options.add_argument(argument)
    # The driver is Debian's: no Selenium Manager download.
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


DECISIONS_ROUTE = "/v1/agents/{agent_id}/decisions"


def _serves_decisions(node: RunningNode) -> bool:
    """Whether this node has the decision log's route (node.decisions); the page says so otherwise."""
    return any(route.resource is not None and route.resource.canonical == DECISIONS_ROUTE
               for route in node.runner.app.router.routes())


def _drive(node: RunningNode, out: Path) -> dict[str, object]:
    url, admin = node.url, node.admin_token
    seen: dict[str, object] = {}
    browser = _browser()
    wait = WebDriverWait(browser, WAIT_S)

    def css(selector: str) -> Callable[[object], object]:
        return ready.presence_of_element_located((By.CSS_SELECTOR, selector))

    try:
        browser.get(f"{url}/ui/#token={admin}")
        wait.until(css("#live.on"))  # signed in, the watch streaming
        seen["address"] = browser.current_url
        seen["stored"] = browser.execute_script("return sessionStorage.getItem('agent-reach.console.token')")
        browser.get(f"{url}/ui/#/agents")  # a new page load: the token comes from sessionStorage
        wait.until(css(f'tr[data-agent-id="{AGENTS[-1][0]}"]'))
        wait.until(css("#live.on"))
        browser.execute_script("window.__loadedOnce = true")

        _call(url, admin, "POST", "/v1/agents", _agent("lang.summarize.brief", "Summarizer",
                                                       "Summarizes long reports into a few lines", "text.summarize",
                                                       "1", "ready", {"team": "lang"}))
        wait.until(css('tr[data-agent-id="lang.summarize.brief"]'))
        seen["no_reload"] = browser.execute_script("return window.__loadedOnce === true")
        seen["rows"] = len(browser.find_elements(By.CSS_SELECTOR, "#agents-table tbody tr"))
        browser.save_screenshot(str(out / "console-agents.png"))

        browser.find_element(By.CSS_SELECTOR, 'a[data-view="search"]').click()
        box = wait.until(css("#search-q"))
        box.send_keys("translate a contract into German")
        browser.find_element(By.CSS_SELECTOR, "#search-form button[type=submit]").click()
        first = wait.until(css(".hits .hit"))
        seen["first_hit"] = first.get_attribute("data-agent-id")
        seen["hit_text"] = first.text
        browser.save_screenshot(str(out / "console-search.png"))

        _call(url, admin, "POST", "/v1/resolve", {"capability": "translate.text"})
        browser.get(f"{url}/ui/#/agent/lang.translate.deepl_eu")
        wait.until(css("#decisions tbody tr" if _serves_decisions(node) else "#decisions .empty"))
        seen["decisions"] = browser.find_element(By.CSS_SELECTOR, "#decisions").text
        seen["card"] = browser.find_element(By.CSS_SELECTOR, "pre.json").text
        browser.save_screenshot(str(out / "console-agent.png"))

        browser.find_element(By.CSS_SELECTOR, "#signout").click()
        wait.until(ready.visibility_of_element_located((By.CSS_SELECTOR, "#signin-token")))
        browser.find_element(By.CSS_SELECTOR, "#signin-token").send_keys(node.token("sales.crm.viewer",
                                                                                    TokenRole.CALLER))
        browser.find_element(By.CSS_SELECTOR, "#signin-form button[type=submit]").click()
        browser.get(f"{url}/ui/#/agents")
        wait.until(css('tr[data-agent-id="lang.translate.deepl_eu"]'))
        wait.until(css("#live.on"))
        seen["outsider_rows"] = sorted(row.get_attribute("data-agent-id") for row in
                                       browser.find_elements(By.CSS_SELECTOR, "#agents-table tbody tr"))
        seen["console_errors"] = [entry["message"] for entry in browser.get_log("browser")
                                  if entry["level"] == "SEVERE"]
    finally:
        browser.quit()
    return seen


async def test_the_console_in_headless_chromium(console_node: RunningNode, tmp_path: Path) -> None:
    node = console_node
    for agent_id, name, description, capability, version, status, labels in AGENTS:
        await node.register(_agent(agent_id, name, description, capability, version, status, labels))
    await node.register(_agent("ops.secret.keeper", "Vault", "Opens the vault", "vault.open", "1", "ready",
                               {"team": "ops"}, allowed_callers=["ops.*.*"]))
    await node.call("PUT", "/v1/agents/finance.risk.scorer/heartbeat", json={"load": {"inflight": 6, "queued": 2,
                                                                                      "rps": 12.5}})

    seen = await asyncio.to_thread(_drive, node, tmp_path)

    assert "token=" not in str(seen["address"]) and str(seen["address"]).endswith("/ui/#/")
    assert seen["stored"] == node.admin_token
    assert seen["no_reload"] is True and seen["rows"] == len(AGENTS) + 2  # + the summarizer + the restricted one
    assert seen["first_hit"] == "lang.translate.deepl_eu"
    assert "translate.text" in str(seen["hit_text"]) and "capability" in str(seen["hit_text"])
    if _serves_decisions(node):
        assert "decision" in str(seen["decisions"]) and "admin" in str(seen["decisions"])
    else:
        assert "Not available" in str(seen["decisions"])
    assert '"skills"' in str(seen["card"])
    assert "ops.secret.keeper" not in seen["outsider_rows"]
    assert "lang.translate.deepl_eu" in seen["outsider_rows"]
    errors = [message for message in seen["console_errors"]  # type: ignore[attr-defined]
              if _serves_decisions(node) or "/decisions - " not in message]
    assert not errors, errors
    screenshot = tmp_path / "console-agents.png"
    assert screenshot.stat().st_size > 10_000 and screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("AGENT_REACH_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(screenshot, DOCS_SCREENSHOT)
