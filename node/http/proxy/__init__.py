"""Proxy mode (``POST /v1/send``, ``GET /v1/policy``): the node routes and delivers an envelope
itself, for traffic that must be audited.

A sub-room of ``node.http``: the send itself (send.py), callback mode's background pool and the
POST of a result (callbacks.py), the hop count the node keeps of a trace (hops.py), and what a
delivery's answer becomes for its caller (results.py).
"""

from .send import PROXY_KEY, DeliveryFailed, DuplicateEnvelope, NoCallbackEndpoint, Proxy, install_proxy_routes

__all__ = ["PROXY_KEY", "DeliveryFailed", "DuplicateEnvelope", "NoCallbackEndpoint", "Proxy", "install_proxy_routes"]
