"""``GET /v1/federation/snapshot``: the region's live records, streamed as they are read.

The answer is one JSON document — ``{"region", "watermark", "taken_at_ms", "agents": [...]}``,
what any JSON parser reads whole — laid out one record per line::

    {"region":"eu","watermark":812,"taken_at_ms":1796131251781,"agents":[
    {"version":5,"agent_id":"a.b.c",…},
    {"version":811,"agent_id":"a.b.d",…}
    ]}

so a peer (``federation.antientropy``) parses it a record at a time as it arrives, and neither
side holds the whole document: the node reads the records in HSCAN chunks (``RegionSnapshots.chunks``)
and writes each chunk's records as stored (spliced, not encoded again), vetting those the cache
does not hold at the same version. The watermark is the region version read before the first
chunk; a record written during the scan may be newer than it, which the reconcile allows (it keeps
the newer of two versions). Redis failing before the first byte is a 503; after it, the connection
is cut, so a peer sees a document that does not end and refuses it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from ..core import StoreUnavailable, now_ms
from ..store import RegionSnapshots

if TYPE_CHECKING:
    from ..service import RegistryNode

__all__ = ["END", "HEAD_END", "stream_snapshot"]

log = logging.getLogger(__name__)

HEAD_END = b'"agents":['  # how the first line (the head) ends
END = b"]}"  # the last line
CHUNK = 2_000  # records per HSCAN chunk (the store's count hint)


async def stream_snapshot(request: web.Request, node: RegistryNode) -> web.StreamResponse:
    now = now_ms()
    snapshots = RegionSnapshots(node.store)
    watermark = await snapshots.version()
    chunks = snapshots.chunks(chunk=CHUNK)
    first = await anext(chunks)  # a Redis that fails here is still a clean 503
    response = web.StreamResponse(headers={"Content-Type": "application/json", "Cache-Control": "no-store"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    head = orjson.dumps({"region": node.region, "watermark": watermark, "taken_at_ms": now})
    await response.write(head[:-1] + b"," + HEAD_END)
    separator = b"\n"
    try:
        chunk = first
        while chunk is not None:
            ids, raws, leases = chunk
            served = [raw for agent_id, raw, lease in zip(ids, raws, leases)
                      if lease is not None and lease > now and node.vetted(agent_id, raw)]
            if served:
                await response.write(separator + ",\n".join(served).encode())
                separator = b",\n"
            chunk = await anext(chunks, None)
    except StoreUnavailable as exc:
        log.warning("region %s: the snapshot stream was cut: %s", node.region, exc)
        if request.transport is not None:
            request.transport.close()
        return response
    await response.write(b"\n" + END)
    await response.write_eof()
    return response
