"""An admin's actions in the console, in headless Chromium against a live node: each one asks in the
page first (cancelled, nothing changes), then does what it says — checked through the API — and
shows up in the agent's decision log on its page. A caller's token gets no actions. Screenshots go
to the test's folder."""

from __future__ import annotations

import asyncio
from pathlib import Path

from node.core.models import TokenRole

from ..helpers import RunningNode
from .browser import By, agent, browser, call, call_status, needs_chromium, present, severe_errors, visible, waiter
from .browser import console_node  # noqa: F401 - the fixture

pytestmark = needs_chromium

ACTED = "lang.translate.acted"
GONE = "lang.translate.gone"


def _confirm(driver, purpose: str, *, accept: bool = True) -> str:
    """Answer the page's confirmation of ``purpose``; its text."""
    dialog = waiter(driver).until(visible(f'dialog#confirm[open][data-purpose="{purpose}"]'))
    text = dialog.text
    driver.find_element(By.CSS_SELECTOR, "#confirm-ok" if accept else "#confirm-cancel").click()
    waiter(driver).until(lambda d: not d.execute_script("return document.querySelector('#confirm').open"))
    return text


def _admin_rows(driver) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll('#decisions tr[data-kind=\"admin\"]')].map((row) => row.innerText)")


def _act(node: RunningNode, agent_token: str, out: Path) -> dict[str, object]:
    url, admin = node.url, node.admin_token
    record = lambda agent_id: call_status(url, admin, "GET", f"/v1/agents/{agent_id}")  # noqa: E731
    seen: dict[str, object] = {}
    driver = browser()
    wait = waiter(driver)
    try:
        driver.get(f"{url}/ui/#token={admin}")
        driver.get(f"{url}/ui/#/agent/{ACTED}")
        wait.until(present("#action-drain"))

        # Drain, cancelled: asked, and nothing changed.
        driver.find_element(By.CSS_SELECTOR, "#action-drain").click()
        seen["drain_question"] = _confirm(driver, "status", accept=False)
        seen["after_cancel"] = record(ACTED)[1]["status"]
        seen["cancel_notice"] = wait.until(visible("#notice")).text

        # Drain, with a reason.
        driver.find_element(By.CSS_SELECTOR, "#action-reason").send_keys("kernel upgrade")
        driver.find_element(By.CSS_SELECTOR, "#action-drain").click()
        _confirm(driver, "status")
        wait.until(lambda d: any("ready -> draining" in row for row in _admin_rows(d)))
        seen["drained"] = record(ACTED)[1]["status"]
        seen["drain_notice"] = driver.find_element(By.CSS_SELECTOR, "#notice").text
        seen["drain_row"] = _admin_rows(driver)[0]
        seen["page_status"] = driver.find_element(By.CSS_SELECTOR, "#agent-status").text
        seen["page_routable"] = driver.find_element(By.CSS_SELECTOR, "#agent-routable").text
        driver.execute_script("document.querySelector('#decisions').scrollIntoView()")
        driver.save_screenshot(str(out / "console-drained.png"))

        # Status back to ready, chosen from the list.
        wait.until(present("#action-status"))
        driver.execute_script("const s = document.querySelector('#action-status'); s.value = 'ready';")
        driver.find_element(By.CSS_SELECTOR, "#action-set-status").click()
        _confirm(driver, "status")
        wait.until(lambda d: any("draining -> ready" in row for row in _admin_rows(d)))
        seen["restored"] = record(ACTED)[1]["status"]

        # Weight 0.
        weight = driver.find_element(By.CSS_SELECTOR, "#action-weight")
        weight.clear()
        weight.send_keys("0")
        driver.find_element(By.CSS_SELECTOR, "#action-set-weight").click()
        seen["weight_question"] = _confirm(driver, "weight")
        wait.until(lambda d: any("weight 100 -> 0" in row for row in _admin_rows(d)))
        seen["weight"] = record(ACTED)[1]["weight"]
        seen["weight_on_page"] = driver.find_element(By.CSS_SELECTOR, "#agent-weight").text

        # Revoke its tokens: the agent's own token is refused from then on.
        seen["token_before"] = call_status(url, agent_token, "PUT", f"/v1/agents/{ACTED}/heartbeat", {})[0]
        driver.find_element(By.CSS_SELECTOR, "#action-revoke").click()
        seen["revoke_question"] = _confirm(driver, "revoke")
        wait.until(lambda d: any("revoke tokens" in row for row in _admin_rows(d)))
        seen["token_after"] = call_status(url, agent_token, "PUT", f"/v1/agents/{ACTED}/heartbeat", {})
        driver.save_screenshot(str(out / "console-actions.png"))

        # Deregister another agent: the page goes back to the list, which no longer has it.
        driver.get(f"{url}/ui/#/agent/{GONE}")
        wait.until(present("#action-deregister")).click()
        seen["deregister_question"] = _confirm(driver, "deregister")
        wait.until(lambda d: d.current_url.endswith("#/agents"))
        wait.until(present(f'tr[data-agent-id="{ACTED}"]'))
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, f'tr[data-agent-id="{GONE}"]'))
        seen["gone"] = record(GONE)[0]
        seen["gone_log"] = call(url, admin, "GET", f"/v1/agents/{GONE}/decisions")
        seen["errors"] = severe_errors(driver)

        # A caller's token: the agent's page has no actions.
        driver.get(f"{url}/ui/#/agent/{ACTED}&token={node.token('sales.crm.viewer', TokenRole.CALLER)}")
        _confirm(driver, "switch-session")
        wait.until(present("#record-panel"))
        seen["caller_actions"] = len(driver.find_elements(By.CSS_SELECTOR, "#actions, #action-drain"))
    finally:
        driver.quit()
    return seen


async def test_each_action_is_confirmed_done_and_recorded(console_node: RunningNode, tmp_path: Path) -> None:
    node = console_node
    agent_token = node.token(ACTED)
    await node.register(agent(ACTED, "Acted on", "Translates what it is given", "translate.text", "1", "ready",
                              {"team": "lang"}), token=agent_token)
    await node.register(agent(GONE, "Gone soon", "Translates, until it is retired", "translate.text", "1", "ready",
                              {"team": "lang"}))

    seen = await asyncio.to_thread(_act, node, agent_token, tmp_path)

    assert f"Set the status of {ACTED} to draining?" in str(seen["drain_question"]), seen["drain_question"]
    assert seen["after_cancel"] == "ready" and "Not done" in str(seen["cancel_notice"])
    assert seen["drained"] == "draining" and "ready → draining" in str(seen["drain_notice"])
    assert "admin" in str(seen["drain_row"]) and "kernel upgrade" in str(seen["drain_row"])
    assert seen["page_status"] == "draining" and seen["page_routable"] == "not routable"
    assert seen["restored"] == "ready"
    assert "Set the weight" in str(seen["weight_question"]) and "100" in str(seen["weight_question"])
    assert seen["weight"] == 0 and seen["weight_on_page"] == "0"
    assert seen["token_before"] == 200
    status, body = seen["token_after"]  # type: ignore[misc]
    assert status == 401 and body["error"] == "token_revoked", seen["token_after"]
    assert "Revoke every token" in str(seen["revoke_question"])
    assert f"Deregister {GONE}?" in str(seen["deregister_question"])
    assert seen["gone"] == 404
    assert [entry["action"] for entry in seen["gone_log"]["decisions"]] == ["deregister"]  # type: ignore[index]
    assert not seen["errors"], seen["errors"]
    assert seen["caller_actions"] == 0
