"""An OCR agent: reads the text in a scanned image (for the demo, a few known sample scans)."""

from __future__ import annotations

import base64
import binascii
import sys
from typing import Any

from node.client import Capability, Envelope

from .host import main

AGENT_ID = "demo.ocr.scanner"
DESCRIPTION = ("Reads the printed or handwritten text in a scanned document, photo or screenshot "
               "and returns it as plain text, line by line.")
CAPABILITIES = [Capability(name="ocr.image", version="1",
                           description="Extract the text from an image (a file name or base64 'data').",
                           tags=["ocr", "image", "text recognition", "scan"],
                           examples=["read the text on this receipt", "what does this scanned invoice say"])]
SAMPLES = {
    "receipt.png": ["ACME Coffee", "1 x Latte    4.50", "TOTAL        4.50"],
    "invoice.pdf": ["Invoice 2024-117", "Refund: 120.00 EUR", "Reason: damaged parcel"],
}


async def read_text(envelope: Envelope) -> dict[str, Any]:
    payload = envelope.payload if isinstance(envelope.payload, dict) else {}
    if "data" in payload:
        try:
            lines = base64.b64decode(str(payload["data"]), validate=True).decode("utf-8").splitlines()
        except (binascii.Error, UnicodeDecodeError):
            return {"error": "data is not base64 of UTF-8 text", "lines": []}
    else:
        lines = SAMPLES.get(str(payload.get("image", "")), [])
    return {"lines": lines, "confidence": 0.98 if lines else 0.0}


if __name__ == "__main__":
    sys.exit(main(None, agent_id=AGENT_ID, display_name="Scanner OCR", description=DESCRIPTION,
                  capabilities=CAPABILITIES, handler=read_text))
