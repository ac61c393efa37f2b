"""What an admin does to one agent through the API (the console's buttons, ``agent-reach``'s
scripts): set its status or weight, deregister it, revoke its tokens; each action recorded in the
decision log. The other admin routes (keys, token ids, the quarantine) are ``node.http.api``'s.
"""

from .agents import ADMIN_AGENT_ROUTES

__all__ = ["ADMIN_AGENT_ROUTES"]
