"""The demo agents ``agent-reach up --demo`` starts, written with the SDK only (``node.client``).

:func:`start_demo` (:mod:`.driver`) starts them, one region each, and makes a local, a
cross-region and a plain-language call; :class:`AgentHost` (:mod:`.host`) is the small HTTP host
they share. They are part of the installed package, so ``--demo`` works from any directory and
from a wheel. Run one by hand against a node (token from ``$AGENT_REACH_TOKEN``)::

    python -m topology.demo.translator --node http://127.0.0.1:7101
    python -m topology.demo.ocr --node http://127.0.0.1:7102
    python -m topology.demo.image_search --node http://127.0.0.1:7103
"""

from .driver import Demo, DemoError, start_demo
from .host import AgentHost

__all__ = ["AgentHost", "Demo", "DemoError", "start_demo"]
