"""Demo agents written with the SDK (``node.client.ReachClient``) and the ``agent-reach up --demo`` driver.

Run one by hand against a node (token from ``$AGENT_REACH_TOKEN``)::

    python -m examples.translator --node http://127.0.0.1:7101
    python -m examples.ocr --node http://127.0.0.1:7102
    python -m examples.image_search --node http://127.0.0.1:7103
"""

__all__: list[str] = []
