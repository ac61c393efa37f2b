"""A translation agent: short texts between Chinese, English and French (a phrasebook, for the demo)."""

from __future__ import annotations

import sys
from typing import Any

from node.client import Capability, Envelope

from .host import main

AGENT_ID = "demo.translate.phrasebook"
DESCRIPTION = ("Translates short texts and phrases between Chinese, English and French, "
               "for example customer-service replies and refund notes.")
CAPABILITIES = [Capability(name="translate.text", version="1",
                           description="Translate a short text into another language (zh, en, fr).",
                           tags=["translation", "language", "text"],
                           examples=["translate 退款说明 to English", "say 'thank you' in French"])]
PHRASES = {
    ("退款说明", "en"): "refund note", ("退款说明", "fr"): "note de remboursement",
    ("谢谢", "en"): "thank you", ("谢谢", "fr"): "merci",
    ("thank you", "zh"): "谢谢", ("thank you", "fr"): "merci",
    ("hello", "zh"): "你好", ("hello", "fr"): "bonjour",
}


async def translate(envelope: Envelope) -> dict[str, Any]:
    payload = envelope.payload if isinstance(envelope.payload, dict) else {"text": str(envelope.payload)}
    text = str(payload.get("text", ""))
    target = str(payload.get("target_lang", "en"))
    translated = PHRASES.get((text.strip().lower() if text.isascii() else text.strip(), target))
    return {"text": translated or f"[{target}] {text}", "target_lang": target, "known_phrase": translated is not None}


if __name__ == "__main__":
    sys.exit(main(None, agent_id=AGENT_ID, display_name="Phrasebook translator", description=DESCRIPTION,
                  capabilities=CAPABILITIES, handler=translate))
