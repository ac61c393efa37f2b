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
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from node.core.models import TokenRole

from ..helpers import AgentServer, RunningNode
from .browser import By, attributes, needs_chromium, present, ready, severe_errors, texts, visible, waiter
from .browser import console_node  # noqa: F401 - the fixture
from .browser import agent as _agent
from .browser import browser as _browser
from .browser import call as _call

try:
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # pragma: no cover - skipped then (needs_chromium)
    Select = WebDriverWait = None

DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "console.png"

pytestmark = needs_chromium

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


DECISIONS_ROUTE = "/v1/agents/{agent_id}/decisions"


def _serves_decisions(node: RunningNode) -> bool:
    """Whether this node has the decision log's route (node.decisions); the page says so otherwise."""
    return any(route.resource is not None and route.resource.canonical == DECISIONS_ROUTE
               for route in node.runner.app.router.routes())


def _drive(node: RunningNode, out: Path) -> dict[str, object]:
    url, admin = node.url, node.admin_token
    seen: dict[str, object] = {}
    browser = _browser()
    wait = waiter(browser)

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
        seen["rows"] = len(texts(browser, "#agents-table tbody tr"))
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
        seen["outsider_rows"] = sorted(attributes(browser, "#agents-table tbody tr", "data-agent-id"))
        seen["console_errors"] = severe_errors(browser)
    finally:
        browser.quit()
    return seen


async def _register_the_agents(node: RunningNode) -> None:
    for agent_id, name, description, capability, version, status, labels in AGENTS:
        await node.register(_agent(agent_id, name, description, capability, version, status, labels))


async def test_the_console_in_headless_chromium(console_node: RunningNode, tmp_path: Path) -> None:
    node = console_node
    await _register_the_agents(node)
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


# -- lease renewals reach the page -----------------------------------------------------------------

BEATING = "lang.translate.beating"
LEASE_MS = 4_000  # short, so the test spans four leases; the page's leases arrive about every second
BEAT_EVERY_S = 0.5
HEARTBEATING_S = 16.0
MAX_BEATS = int((HEARTBEATING_S + 90) / BEAT_EVERY_S)  # the page's start and WAIT_S'es included
# Every 250 ms the page notes what its row of the agent says (status cell, lease cell), and whether
# the page's own rule calls the agent routable.
SAMPLER = """
window.__samples = [];
window.__sampler = setInterval(() => {
  const row = document.querySelector('tr[data-agent-id="%s"]');
  window.__samples.push({at: Date.now(), status: row ? row.children[2].textContent : null,
                         lease: row ? row.children[row.children.length - 1].textContent : null});
}, 250);
""" % BEATING


def _sample_the_row(node: RunningNode) -> list[dict[str, object]]:
    """What the page says of the agent every 250 ms, over HEARTBEATING_S once it shows it."""
    browser = _browser()
    wait = waiter(browser)
    try:
        browser.get(f"{node.url}/ui/#token={node.admin_token}")
        browser.get(f"{node.url}/ui/#/agents")
        wait.until(present(f'tr[data-agent-id="{BEATING}"]'))
        wait.until(present("#live.on"))
        browser.execute_script(SAMPLER)
        spanned = ("const s = window.__samples; return s.length > 1 && s[s.length - 1].at - s[0].at >= arguments[0]")
        WebDriverWait(browser, HEARTBEATING_S + 30).until(lambda driver: driver.execute_script(spanned,
                                                                                               HEARTBEATING_S * 1000))
        return browser.execute_script("clearInterval(window.__sampler); return window.__samples")
    finally:
        browser.quit()


async def test_a_heartbeating_agent_stays_routable_in_the_page(console_node: RunningNode) -> None:
    node = console_node
    await node.register(_agent(BEATING, "Beating", "Renews its lease every half second", "translate.text", "1",
                               "ready", {"team": "lang"}, lease_ttl_ms=LEASE_MS))
    # The agent heartbeats from its registration on, until the page has watched it long enough;
    # bounded in count and time all the same.
    sampling = asyncio.ensure_future(asyncio.to_thread(_sample_the_row, node))
    beats, began = 0, time.monotonic()
    while not sampling.done() and beats < MAX_BEATS and time.monotonic() - began < MAX_BEATS * BEAT_EVERY_S:
        status, body = await node.call("PUT", f"/v1/agents/{BEATING}/heartbeat", json={})
        assert status == 200, body
        beats += 1
        await asyncio.wait({sampling}, timeout=BEAT_EVERY_S)  # the agent's pace, not a synchronisation
    samples = await sampling
    spanned_s = (samples[-1]["at"] - samples[0]["at"]) / 1000
    assert spanned_s >= HEARTBEATING_S - 2 and len(samples) >= 40, (spanned_s, len(samples))
    assert spanned_s * 1000 >= 3 * LEASE_MS  # several leases ran out and were renewed meanwhile
    stale = [sample for sample in samples if "not routable" in str(sample["status"]) or sample["lease"] == "in 0s"]
    assert not stale, stale[:5]
    assert all(str(sample["status"]).startswith("ready") for sample in samples), samples[:3]


# -- a link signs in only where there is no session -----------------------------------------------

def _follow_links(node: RunningNode) -> dict[str, object]:
    url, admin = node.url, node.admin_token
    viewer = node.token("sales.crm.viewer", TokenRole.CALLER)
    seen: dict[str, object] = {}
    browser = _browser()
    wait = waiter(browser)
    stored = "return sessionStorage.getItem('agent-reach.console.token')"
    try:
        browser.get(f"{url}/ui/#token={admin}")
        wait.until(present("#live.on"))
        # A link carrying another token, opened in the signed-in tab (a page load).
        browser.get(f"{url}/ui/#/agents&token={viewer}")
        dialog = wait.until(visible('dialog#confirm[open][data-purpose="switch-session"]'))
        seen["asked"] = dialog.text
        seen["address_while_asking"] = browser.current_url
        seen["stored_while_asking"] = browser.execute_script(stored)
        browser.find_element(By.CSS_SELECTOR, "#confirm-cancel").click()
        wait.until(visible("#notice"))
        seen["kept_notice"] = browser.find_element(By.CSS_SELECTOR, "#notice").text
        seen["kept_whoami"] = browser.find_element(By.CSS_SELECTOR, "#whoami").text
        seen["kept_stored"] = browser.execute_script(stored)
        seen["kept_view"] = browser.current_url
        # The same link followed within the page (a hash change), and this time accepted.
        browser.execute_script("location.hash = arguments[0]", f"#/agents&token={viewer}")
        wait.until(visible('dialog#confirm[open][data-purpose="switch-session"]'))
        browser.find_element(By.CSS_SELECTOR, "#confirm-ok").click()
        wait.until(lambda driver: "sales.crm.viewer" in driver.find_element(By.CSS_SELECTOR, "#whoami").text)
        seen["switched_stored"] = browser.execute_script(stored)
        seen["switched_address"] = browser.current_url
        # A link with the token in use already asks nothing.
        browser.get(f"{url}/ui/#/search&token={viewer}")
        wait.until(present("#search-q"))
        seen["same_token_dialog_open"] = browser.execute_script("return document.querySelector('#confirm').open")
        seen["errors"] = severe_errors(browser)
    finally:
        browser.quit()
    return seen


async def test_a_link_does_not_switch_a_signed_in_session_without_asking(console_node: RunningNode) -> None:
    seen = await asyncio.to_thread(_follow_links, console_node)
    assert "sales.crm.viewer (caller)" in str(seen["asked"]) and "admin (admin)" in str(seen["asked"])
    assert "token=" not in str(seen["address_while_asking"])
    assert seen["stored_while_asking"] == console_node.admin_token  # nothing switched while asking
    assert seen["kept_stored"] == console_node.admin_token and "admin · admin" in str(seen["kept_whoami"])
    assert "not used" in str(seen["kept_notice"]) and str(seen["kept_view"]).endswith("/ui/#/agents")
    assert seen["switched_stored"] != console_node.admin_token and str(seen["switched_address"]).endswith("#/agents")
    assert seen["same_token_dialog_open"] is False
    assert not seen["errors"], seen["errors"]


# -- groups, probes over time, wrapping, and a window 700 px wide ---------------------------------

LONG_DESCRIPTION = ("Reconciles supplier invoices against purchase orders and delivery notes, flags "
                    "discrepancies in quantities, prices and currencies, and drafts correspondence for the "
                    "accounts payable team in English, German and French")
# A line of the element's text may only end at a space (or the text's end): a word is never cut.
BREAKS_ONLY_AT_SPACES = """
const element = arguments[0];
const text = element.firstChild;
const range = document.createRange();
let lastTop = null, cuts = [], lines = 1;
for (let i = 0; i < text.length; i++) {
  range.setStart(text, i); range.setEnd(text, i + 1);
  const rects = range.getClientRects();
  if (!rects.length) continue;
  const top = Math.round(rects[0].top);
  if (lastTop !== null && top > lastTop + 2) {
    lines += 1;
    if (text.data[i - 1] !== ' ' && text.data[i] !== ' ') cuts.push(text.data.slice(Math.max(0, i - 8), i + 8));
  }
  lastTop = top;
}
return {lines, cuts};
"""
OVERFLOW = "return [document.documentElement.scrollWidth, window.innerWidth]"
# Read in one go: the table is drawn again whenever the watch says something (each second, leases).
GROUPS = "return [...document.querySelectorAll('#agents-table tbody')].map((body) => body.dataset.group)"


def _narrow_tour(node: RunningNode, probed: AgentServer, out: Path) -> dict[str, object]:
    url, admin = node.url, node.admin_token
    seen: dict[str, object] = {}
    browser = _browser(width=700, height=900)
    wait = waiter(browser)
    try:
        browser.get(f"{url}/ui/#token={admin}")
        browser.get(f"{url}/ui/#/agents")
        wait.until(present('tr[data-agent-id="docs.ocr.probed"]'))
        seen["width_agents"] = browser.execute_script(OVERFLOW)
        seen["table_fits"] = browser.execute_script(
            "return document.querySelector('#agents-table table').scrollWidth"
            " <= document.querySelector('#agents-table').clientWidth")
        browser.save_screenshot(str(out / "console-agents-700.png"))

        Select(browser.find_element(By.CSS_SELECTOR, "#group-by")).select_by_value("capability")
        wait.until(present('tbody[data-group="translate.text"] tr[data-agent-id="lang.translate.deepl_eu"]'))
        seen["capability_groups"] = browser.execute_script(GROUPS)
        seen["capability_head"] = browser.execute_script(
            "return document.querySelector('tbody[data-group=\"ocr.image\"] tr.group-head').innerText")
        seen["group_in_address"] = browser.current_url
        Select(browser.find_element(By.CSS_SELECTOR, "#group-by")).select_by_value("namespace")
        wait.until(present('tr.group-head.namespace[data-namespace="lang"]'))
        seen["namespace_groups"] = browser.execute_script(GROUPS)
        seen["namespace_heads"] = browser.execute_script(
            "return [...document.querySelectorAll('tr.group-head')].map((row) => row.innerText)")
        browser.save_screenshot(str(out / "console-grouped-700.png"))

        browser.get(f"{url}/ui/#/agent/finance.invoices.matcher")
        description = wait.until(present("dl.kv dd .prose"))
        seen["wrapping"] = browser.execute_script(BREAKS_ONLY_AT_SPACES, description)
        trace = wait.until(present('#decisions tr[data-kind="decision"] td.trace'))
        seen["trace"] = trace.text
        seen["trace_inside"] = browser.execute_script(
            "const cell = arguments[0].getBoundingClientRect(), panel = document.querySelector('#decisions')"
            ".getBoundingClientRect(); return cell.right <= panel.right + 1 && cell.width > 0", trace)
        seen["stamp"] = browser.find_element(By.CSS_SELECTOR, "#decisions tbody tr td").text
        seen["width_agent"] = browser.execute_script(OVERFLOW)
        browser.save_screenshot(str(out / "console-agent-700.png"))

        browser.get(f"{url}/ui/#/")
        wait.until(present("#region-cards .card[data-region]"))
        seen["width_overview"] = browser.execute_script(OVERFLOW)
        browser.get(f"{url}/ui/#/search?q=translate")
        wait.until(present(".hits .hit"))
        seen["width_search"] = browser.execute_script(OVERFLOW)

        browser.get(f"{url}/ui/#/agent/docs.ocr.probed")
        wait.until(lambda driver: len(texts(driver, '.probe-strip[data-kind="readiness"] .tick.ok')) >= 2)
        probed.ready = False  # its readiness probe answers 503 from now on
        wait.until(present('.probe-strip[data-kind="readiness"] .tick.bad'))
        seen["latest_probe"] = texts(browser, "table.probe-results tbody tr")[0]
        seen["strip"] = texts(browser, '.probe-strip[data-kind="readiness"]')[0]
        browser.execute_script("document.querySelector('#probes').scrollIntoView()")
        browser.save_screenshot(str(out / "console-probes-700.png"))
        seen["errors"] = severe_errors(browser)
    finally:
        browser.quit()
    return seen


async def test_groups_probes_wrapping_and_a_700_px_window(console_node: RunningNode, tmp_path: Path) -> None:
    node = console_node
    await _register_the_agents(node)
    await node.register(_agent("lang.translate.marian", "Marian", "Translates short texts offline",
                               "translate.text", "1", "draining", {"team": "lang"}))
    await node.register(_agent("finance.invoices.matcher", "Invoice matcher", LONG_DESCRIPTION, "invoice.match", "1",
                               "ready", {"team": "payments"}))
    await node.resolve(capability="invoice.match", trace_id="4bf92f3577b34da6a3ce929d0e0e4736")
    probed = await AgentServer("probed").start()
    try:
        await node.register(_agent("docs.ocr.probed", "Probed OCR", "Reads receipts", "ocr.image", "2", "ready",
                                   {"team": "docs"}, endpoint=probed.url,
                                   readiness_probe={"url": f"{probed.url}/readyz", "interval_ms": 200,
                                                    "failure_threshold": 2, "success_threshold": 1}))
        seen = await asyncio.to_thread(_narrow_tour, node, probed, tmp_path)
    finally:
        await probed.aclose()

    for page in ("width_agents", "width_agent", "width_overview", "width_search"):
        scroll_width, window_width = seen[page]  # type: ignore[misc]
        assert scroll_width <= window_width, (page, seen[page])  # nothing runs off the side at 700 px
    assert seen["table_fits"] is True
    assert seen["capability_groups"] == sorted({"translate.text", "ocr.image", "search.images", "payment.risk_check",
                                                "invoice.match"})
    assert "2 agents" in str(seen["capability_head"]) and "routable" in str(seen["capability_head"])
    assert str(seen["group_in_address"]).endswith("#/agents?group=capability")
    assert seen["namespace_groups"] == ["docs/ocr", "finance/invoices", "finance/risk", "lang/translate",
                                        "search/images"]
    heads = [str(head) for head in seen["namespace_heads"]]  # type: ignore[attr-defined]
    assert heads[:2] == ["docs namespace · 1 group", "docs → ocr 2 agents · 2 routable"], heads
    assert "lang → translate 2 agents · 1 routable" in heads  # marian is draining
    wrapping = seen["wrapping"]
    assert wrapping["lines"] >= 3 and wrapping["cuts"] == [], wrapping  # type: ignore[index]
    assert seen["trace"] == "4bf92f3577b34da6a3ce929d0e0e4736" and seen["trace_inside"] is True
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}", str(seen["stamp"])), seen["stamp"]
    assert "failed" in str(seen["latest_probe"]) and "503" in str(seen["latest_probe"]), seen["latest_probe"]
    assert "readiness" in str(seen["strip"]) and "passed" in str(seen["strip"])
    assert not seen["errors"], seen["errors"]
