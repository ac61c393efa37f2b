"""What the console's browser tests share: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, which ``make test`` installs when missing) driven by Selenium, the skip when
they are missing, the node's API called from the browser's thread, and agents as an operator
would register them. Every wait has a deadline."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable

import pytest

from node.config import NodeConfig
from node.service import RegistryNode
from topology.composition import attach_discovery

from ..conftest import TEST_SECRET
from ..helpers import RunningNode, registration, start_node

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
WAIT_S = 20

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # pragma: no cover - the dev extra installs it
    webdriver = Service = By = ready = WebDriverWait = None  # type: ignore[assignment,misc]

needs_chromium = pytest.mark.skipif(
    webdriver is None or not CHROMIUM or not CHROMEDRIVER,
    reason="headless Chromium is not installed (apt-get install chromium chromium-driver; make test does)")


@pytest.fixture
async def console_node(redis_url: str, region: str) -> AsyncIterator[RunningNode]:
    """A node of region eu-west (as an operator would name it; the test's key prefix keeps it apart
    in the shared Redis) with lexical search, sweeping and syncing leases every 100 ms."""
    config = NodeConfig(region="eu-west", key_prefix=f"console-{region}", redis_url=redis_url, port=0,
                        sweep_interval_ms=100, lease_sync_interval_ms=100, leader_ttl_ms=1_000,
                        egress={"allow": ["loopback"]})
    node = RegistryNode(config, secret=TEST_SECRET)
    attach_discovery(node, semantic_enabled=False)
    running = await start_node(node)
    yield running
    await running.aclose()


def call(url: str, token: str, method: str, path: str, body: object = None) -> object:
    """The node's API from the browser's thread (the test's loop serves the node meanwhile)."""
    request = urllib.request.Request(url + path, method=method, data=json.dumps(body).encode() if body else None,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def call_status(url: str, token: str, method: str, path: str, body: object = None) -> tuple[int, object]:
    """:func:`call`, answering ``(status, body)`` for an error status too."""
    try:
        return 200, call(url, token, method, path, body)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def agent(agent_id: str, name: str, description: str, capability: str, version: str, status: str,
          labels: dict[str, str], **extra: object) -> dict[str, object]:
    body = registration(agent_id, capability=capability, version=version, description=description,
                        display_name=name, status=status, labels=labels, max_concurrency=8,
                        **{"lease_ttl_ms": 600_000, **extra})
    body["capabilities"][0]["description"] = description
    return body


def browser(width: int = 1400, height: int = 860) -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     f"--window-size={width},{height}", "--no-first-run", "--disable-extensions"):
        options.add_argument(argument)
    # The driver is Debian's: no Selenium Manager download.
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def present(selector: str) -> Callable[[object], object]:
    return ready.presence_of_element_located((By.CSS_SELECTOR, selector))


def visible(selector: str) -> Callable[[object], object]:
    return ready.visibility_of_element_located((By.CSS_SELECTOR, selector))


def waiter(driver: webdriver.Chrome) -> WebDriverWait:
    return WebDriverWait(driver, WAIT_S)


def texts(driver: webdriver.Chrome, selector: str) -> list[str]:
    """The text of every element ``selector`` finds, read in one go: the page draws its tables again
    whenever the watch says something (leases, about every second), so an element found in one call
    may be gone by the next."""
    return driver.execute_script("return [...document.querySelectorAll(arguments[0])].map((el) => el.innerText)",
                                 selector)


def attributes(driver: webdriver.Chrome, selector: str, name: str) -> list[str | None]:
    """The attribute ``name`` of every element ``selector`` finds, read in one go (see :func:`texts`)."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((el) => el.getAttribute(arguments[1]))",
        selector, name)


def severe_errors(driver: webdriver.Chrome) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


__all__ = ["By", "CHROMEDRIVER", "CHROMIUM", "WAIT_S", "agent", "browser", "call", "call_status", "console_node",
           "needs_chromium", "present", "ready", "severe_errors", "texts", "attributes", "visible", "waiter",
           "webdriver"]
