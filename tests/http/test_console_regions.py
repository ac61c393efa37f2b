"""The console across regions, in headless Chromium: federated regions in this process (the real
Redis, the embedded Kafka broker, real HTTP). The region switcher links to each peer's console (its
node URL from the topology) and signs in there with the token; an agent another region keeps is
shown once as remote — its region in one column, no "home region" in others — and its page says
where to act on it, as the API does (409 ``not_home_region``)."""

from __future__ import annotations

import asyncio

import pytest

from ..federation.test_summaries import Trio
from ..helpers import RunningNode, registration, wait_for
from .browser import By, attributes, browser, needs_chromium, present, severe_errors, texts, waiter

pytestmark = [needs_chromium, pytest.mark.timeout(180)]

REMOTE = "lang.translate.far"


def _tour(home: RunningNode, peer: RunningNode, peer_region: str) -> dict[str, object]:
    seen: dict[str, object] = {}
    driver = browser()
    wait = waiter(driver)
    stored = "return sessionStorage.getItem('agent-reach.console.token')"
    try:
        driver.get(f"{home.url}/ui/#token={home.admin_token}")
        driver.get(f"{home.url}/ui/#/agents")
        wait.until(present(f'tr[data-agent-id="{REMOTE}"]'))
        seen["row"] = texts(driver, f'tr[data-agent-id="{REMOTE}"] > td')
        wait.until(present(f'#region-switch a[data-region="{peer_region}"]'))
        seen["switch_href"] = attributes(driver, f'#region-switch a[data-region="{peer_region}"]', "href")[0]
        seen["switch_text"] = texts(driver, "#region-switch")[0]

        driver.get(f"{home.url}/ui/#/agent/{REMOTE}")
        seen["elsewhere"] = wait.until(present("#actions .empty")).text
        seen["lease"] = driver.find_element(By.CSS_SELECTOR, "#agent-lease").text
        seen["errors"] = severe_errors(driver)

        # Clicked in the page: the switcher is drawn again when a peer's freshness changes.
        driver.execute_script("document.querySelector(arguments[0]).click()",
                              f'#region-switch a[data-region="{peer_region}"]')
        wait.until(lambda d: d.current_url.startswith(peer.url))
        wait.until(present("#live.on"))
        wait.until(lambda d: peer_region in d.find_element(By.CSS_SELECTOR, "#node-facts").text)
        seen["peer_address"] = driver.current_url
        seen["peer_stored"] = driver.execute_script(stored)
        seen["peer_whoami"] = driver.find_element(By.CSS_SELECTOR, "#whoami").text
    finally:
        driver.quit()
    return seen


async def test_the_region_switcher_and_a_remote_agent(redis_url: str, region: str) -> None:
    from topology.embedded import EmbeddedKafka

    async with EmbeddedKafka() as kafka:
        trio = Trio(redis_url, region, kafka.bootstrap_servers)
        a, b, _ = trio.names
        try:
            home, peer = await trio.start(a), await trio.start(b)
            await peer.register(registration(REMOTE, lease_ttl_ms=600_000))

            async def replicated() -> bool:
                status, body = await home.call("GET", f"/v1/agents/{REMOTE}")
                return status == 200 and body["region"] == b

            await wait_for(replicated, timeout_s=30, message="the peer's agent in the home region")
            status, body = await home.call("PATCH", f"/v1/admin/agents/{REMOTE}", json={"status": "draining"})
            assert status == 409 and body["error"] == "not_home_region" and b in body["message"], body
            status, body = await peer.call("GET", f"/v1/agents/{REMOTE}", token=home.admin_token)
            assert status == 200 and body["status"] == "ready"  # one token for every region

            seen = await asyncio.to_thread(_tour, home, peer, b)
        finally:
            await trio.aclose()

    row = [str(cell) for cell in seen["row"]]  # type: ignore[attr-defined]
    assert b in row[1] and "remote" in row[1], row
    assert not any("home region" in cell for cell in row), row  # the region shows once, in its column
    assert row[-1] == "—", row
    assert seen["switch_href"] == f"{peer.url}/ui/", seen["switch_href"]
    assert a in str(seen["switch_text"]) and b in str(seen["switch_text"])
    assert f"Region {b} keeps this agent" in str(seen["elsewhere"]) and b in str(seen["lease"])
    assert not seen["errors"], seen["errors"]
    # Followed, the link signed the peer's console in with the same token, which left the address bar.
    assert str(seen["peer_address"]).startswith(peer.url) and "token=" not in str(seen["peer_address"])
    assert seen["peer_stored"] == home.admin_token and "admin · admin" in str(seen["peer_whoami"])
