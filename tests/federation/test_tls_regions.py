"""Three regions over https with mutual TLS: every node serves with a certificate of the test's
CA and requires a client certificate of it; peers forward lookups and resolves, pull snapshots
and fetch key sets over TLS with the CA (``[node] ca_file``, ``client_cert_file``), and
``agent-reach up``'s launcher waits for them the same way. Separate node processes, a real Redis
per region and the embedded Kafka, all started by ``topology.launcher.LocalCluster``.

``replicate_depth = 1``: each region replicates its nearest peer (anti-entropy snapshots over
https) and keeps only summaries of the other, whose agents it asks that peer's node for
(forwarded lookups over https).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from node.client import CallVerifier
from node.core.models import key_region
from topology import Topology
from topology.launcher import LocalCluster

from ..certs import CertificateAuthority, Issued
from ..helpers import registration, wait_for

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]

SECRET = b"tls-regions-test-secret-0123456789"
CAPABILITY = "tls.regions.echo"


def tls_topology(ca: CertificateAuthority, node: Issued) -> Topology:
    """ra replicates rb and asks rc; rb replicates ra and asks rc; rc replicates rb and asks ra."""
    node_url = "https://127.0.0.1:1"  # ports are replaced by free ones (any_port); the scheme stays
    return Topology.model_validate({
        "name": "tls-test",
        "federation": {"beacon_interval_ms": 200, "stale_after_ms": 1_500, "anti_entropy_min_interval_ms": 200,
                       "summary_interval_ms": 200, "replicate_depth": 1},
        "node": {"sweep_interval_ms": 200, "leader_ttl_ms": 1_000, "lease_sync_interval_ms": 200,
                 "semantic_enabled": False, "egress": {"allow": ["loopback"]},
                 "tls_cert_file": str(node.cert_file), "tls_key_file": str(node.key_file),
                 "tls_client_ca_file": str(ca.ca_file), "ca_file": str(ca.ca_file),
                 "client_cert_file": str(node.cert_file), "client_key_file": str(node.key_file)},
        "regions": [
            {"name": "ra", "node_urls": [node_url + "01"], "prefer": ["rb", "rc"]},
            {"name": "rb", "node_urls": [node_url + "02"], "prefer": ["ra", "rc"]},
            {"name": "rc", "node_urls": [node_url + "03"], "prefer": ["rb", "ra"]},
        ],
    })


class Regions:
    """The running cluster and a client of it with the CA and a client certificate."""

    def __init__(self, local: LocalCluster, session: aiohttp.ClientSession, ca: CertificateAuthority) -> None:
        self.local = local
        self.session = session
        self.ca = ca
        self.headers = {"Authorization": f"Bearer {local.admin_token()}"}

    async def call(self, region: str, method: str, path: str, json: Any = None) -> tuple[int, Any]:
        async with self.session.request(method, self.local.url(region) + path, json=json,
                                        headers=self.headers) as response:
            return response.status, await response.json(content_type=None)

    async def status(self, region: str) -> dict[str, Any]:
        status, reply = await self.call(region, "GET", "/v1/federation/status")
        assert status == 200, reply
        return reply


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[CertificateAuthority, Issued, Issued]:
    ca = CertificateAuthority(tmp_path_factory.mktemp("regions-pki"))
    return ca, ca.issue("regions.node"), ca.issue("regions.operator", server=False)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def regions(pki: tuple[CertificateAuthority, Issued, Issued]) -> AsyncIterator[Regions]:
    ca, node, operator = pki
    async with LocalCluster(tls_topology(ca, node), secret=SECRET, any_port=True, log_level="WARNING") as local:
        context = ssl.create_default_context(cafile=str(ca.ca_file))
        context.load_cert_chain(operator.cert_file, operator.key_file)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context),
                                         timeout=aiohttp.ClientTimeout(total=10)) as session:
            yield Regions(local, session, ca)


async def test_every_node_listens_on_https_and_refuses_a_client_without_a_certificate(regions: Regions) -> None:
    for region in ("ra", "rb", "rc"):
        url = regions.local.url(region)
        assert url.startswith("https://127.0.0.1:")
        status, _ = await regions.call(region, "GET", "/readyz")
        assert status == 200
        without_cert = ssl.create_default_context(cafile=str(regions.ca.ca_file))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=without_cert)) as session:
            with pytest.raises(aiohttp.ClientError):
                async with session.get(f"{url}/readyz", timeout=aiohttp.ClientTimeout(total=5)) as response:
                    await response.read()
        async with aiohttp.ClientSession() as session:  # plain http on the https port: no answer
            with pytest.raises(aiohttp.ClientError):
                async with session.get(url.replace("https://", "http://") + "/readyz",
                                       timeout=aiohttp.ClientTimeout(total=5)) as response:
                    await response.read()


async def test_peers_pull_snapshots_and_key_sets_over_tls(regions: Regions) -> None:
    missing: dict[str, Any] = {}

    async def synced() -> bool:
        missing.clear()
        for region in ("ra", "rb", "rc"):
            status = await regions.status(region)
            replicated = [view["region"] for view in status["peers"] if view.get("replicated", True)]
            known = {key_region(kid) for kid in status["peer_keys"]["known"]}
            if status["anti_entropy"]["runs"] < 1 or not {"ra", "rb", "rc"} - {region} <= known or not replicated:
                missing[region] = {"anti_entropy": status["anti_entropy"], "peer_keys": status["peer_keys"],
                                   "replicated": replicated}
        return not missing

    try:
        await wait_for(synced, timeout_s=120, message="every region's snapshots and peer keys, over https")
    except AssertionError as timeout:
        raise AssertionError(f"{timeout}; not yet synced: {missing}") from None
    for region in ("ra", "rb", "rc"):
        status = await regions.status(region)
        # A pull may have failed while a peer's node was still starting; the last one of each peer landed.
        assert status["anti_entropy"]["last_error"] == {}, status["anti_entropy"]
        print(f"{region}: anti-entropy runs {status['anti_entropy']['runs']}, "
              f"peer key fetches {status['peer_keys']['fetches']} (failures {status['peer_keys']['failures']})")


async def test_a_summary_only_peer_is_asked_over_tls_for_lookups_and_resolves(regions: Regions) -> None:
    status, reply = await regions.call("ra", "POST", "/v1/agents",
                                       registration("tls.regions.a1", capability=CAPABILITY, lease_ttl_ms=600_000))
    assert status in (200, 201), reply

    async def forwarded_lookup() -> dict[str, Any] | None:
        found, body = await regions.call("rc", "GET", "/v1/agents/tls.regions.a1")
        return body if found == 200 else None

    record = await wait_for(forwarded_lookup, timeout_s=30, message="rc to find ra's agent through ra's node")
    assert record["region"] == "ra"
    summaries = (await regions.status("rc"))["summaries"]
    assert summaries["forwarded"] >= 1 and summaries["unanswered"] == 0, summaries

    async def resolved() -> dict[str, Any] | None:
        answered, ticket = await regions.call("rc", "POST", "/v1/resolve", {"capability": CAPABILITY})
        return ticket if answered == 200 else None

    ticket = await wait_for(resolved, timeout_s=30, message="a resolve in rc answered by ra's node")
    target = ticket["target"]
    assert (target["agent_id"], target["region"]) == ("tls.regions.a1", "ra")
    # rb replicates ra: the agent is there without a forward, and rb's key set (fetched from ra
    # over https) verifies the credential ra signed
    found, body = await regions.call("rb", "GET", "/v1/agents/tls.regions.a1")
    assert found == 200 and body["region"] == "ra", body
    context = regions.session.connector._ssl  # type: ignore[union-attr]  # the CA and the operator's certificate
    async with CallVerifier(regions.local.url("rb"), agent_id="tls.regions.a1", ssl_context=context) as verifier:
        claims = await verifier.verify(f"Bearer {target['credential']}")
    assert claims.iss == "ra" and claims.aud == "tls.regions.a1"


async def test_the_topology_names_https_node_urls_and_their_files(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    topology = tls_topology(ca, ca.issue("n"))
    config = topology.node_config("rb", redis_url="redis://127.0.0.1:6379/0")
    assert config.serves_tls and config.advertise_url.startswith("https://")
    assert isinstance(config.client_ssl_context(), ssl.SSLContext)
