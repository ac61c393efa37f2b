"""Decisions and traces name no hidden agent: a public agent reading its own decisions
(``/v1/agents/{id}/decisions``) and the traces it took part in sees neither a restricted agent that
stood beside it in ``alternates`` nor the name and trace ids of a caller whose calls reached it.
The caller that sent them, and admins, still see everything they saw before."""

from __future__ import annotations

import json

from node.core.models import TokenRole

from ..helpers import AgentServer, RunningNode, registration

SENDS = 15


async def test_a_public_agent_s_decisions_and_traces_name_no_hidden_agent_nor_the_caller(node: RunningNode) -> None:
    public, hidden = await AgentServer("public").start(), await AgentServer("hidden").start()
    try:
        await node.register(registration("pub.echo.one", capability="report.make", endpoint=f"{public.url}/invoke",
                                         weight=10_000))
        await node.register(registration("fin.ledger.core", capability="report.make", endpoint=f"{hidden.url}/invoke",
                                         weight=1, allowed_callers=["fin.*.*"]))
        fin = node.token("fin.app.main", TokenRole.CALLER)
        for n in range(SENDS):
            envelope = {"id": f"fin-envelope-{n}", "type": "request", "operation": "report.make",
                        "trace_id": f"fin-trace-{n}", "payload": {"n": n}}
            status, body = await node.call("POST", "/v1/send", json=envelope, token=fin)
            assert status == 200, body
        assert public.calls >= 1

        # What the fin caller and the admin see: the hidden agent among the alternates.
        status, admin_view = await node.call("GET", "/v1/agents/pub.echo.one/decisions")
        assert status == 200 and "fin.ledger.core" in json.dumps(admin_view)
        status, fin_view = await node.call("GET", "/v1/agents/pub.echo.one/decisions", token=fin)
        assert status == 200 and fin_view["count"] >= 1
        assert all(entry["caller"] == "fin.app.main" and entry["trace_id"].startswith("fin-trace-")
                   for entry in fin_view["decisions"])

        # What the public agent sees of its own decisions: that it was chosen, by nobody it may name.
        agent = node.token("pub.echo.one", TokenRole.AGENT)
        status, own = await node.call("GET", "/v1/agents/pub.echo.one/decisions", token=agent)
        assert status == 200 and own["count"] == admin_view["count"] >= 1, own
        text = json.dumps(own)
        assert "fin.ledger.core" not in text and "fin.app.main" not in text and "fin-trace-" not in text, own
        assert all(entry["alternates"] == [] for entry in own["decisions"] if "alternates" in entry)

        # And of the traces it took part in.
        taken = next(entry for entry in fin_view["decisions"] if entry["agent_id"] == "pub.echo.one")["trace_id"]
        status, trace = await node.call("GET", f"/v1/traces/{taken}", token=agent)
        assert status == 200 and trace["count"] >= 1, trace
        text = json.dumps(trace["events"])
        assert "fin.ledger.core" not in text and "fin.app.main" not in text, trace
        status, fin_trace = await node.call("GET", f"/v1/traces/{taken}", token=fin)
        assert status == 200 and "fin.app.main" in json.dumps(fin_trace)
    finally:
        await public.aclose()
        await hidden.aclose()
