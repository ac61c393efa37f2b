"""An image-search agent: finds pictures matching a description (a tiny in-memory catalog for the demo)."""

from __future__ import annotations

import re
import sys
from typing import Any

from node.client import Capability, Envelope

from .host import main

AGENT_ID = "demo.images.catalog"
DESCRIPTION = ("Finds photos and pictures that match a plain-language description, "
               "such as 'a cat sleeping on a red sofa' or 'sunset over the sea'.")
CAPABILITIES = [Capability(name="image:search", version="1",
                           description="Search the photo library by a description; returns the best matches.",
                           tags=["images", "photos", "search", "pictures"],
                           examples=["find pictures of a cat", "photos of a beach at sunset"])]
CATALOG = {
    "img-001.jpg": "a grey cat sleeping on a red sofa",
    "img-002.jpg": "sunset over the sea with a sailing boat",
    "img-003.jpg": "a dog running on the beach",
    "img-004.jpg": "city skyline at night with lights",
}


async def search(envelope: Envelope) -> dict[str, Any]:
    payload = envelope.payload if isinstance(envelope.payload, dict) else {"query": str(envelope.payload)}
    words = set(re.findall(r"[a-z]+", str(payload.get("query", "")).lower())) - {"a", "an", "the", "of", "on"}
    scored = sorted(((len(words & set(caption.split())), name, caption) for name, caption in CATALOG.items()),
                    reverse=True)
    return {"matches": [{"image": name, "caption": caption, "score": score}
                        for score, name, caption in scored if score > 0][: int(payload.get("k", 3))]}


if __name__ == "__main__":
    sys.exit(main(None, agent_id=AGENT_ID, display_name="Photo catalog search", description=DESCRIPTION,
                  capabilities=CAPABILITIES, handler=search))
