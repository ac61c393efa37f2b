"""Node's names that the command line needs before it may import node, stated here.

Importing a face of ``node`` loads its pydantic models, and ``node.trust`` Redis and
cryptography with them: about a second on a small machine, more than the whole start of a light
command (``--version``, ``token``, the operator commands). Their parsers and the operator
commands' output take these from here instead; each is the value of the name in the
comment beside it, and ``tests/topology/test_cli_imports.py`` fails when one drifts from it.
"""

from __future__ import annotations

__all__ = ["CA_FILE_ENV", "CLIENT_CERT_FILE_ENV", "CLIENT_KEY_FILE_ENV", "DEFAULT_TOKEN_TTL_S", "LOG_FORMATS",
           "NOT_IN_ONE_LINE", "TLS_ENV", "TOKEN_ENV", "URL_ENV"]

LOG_FORMATS = ("text", "json")  # node.ops.LOG_FORMATS
TOKEN_ENV = "AGENT_REACH_TOKEN"  # node.client.TOKEN_ENV
URL_ENV = "AGENT_REACH_URL"  # node.client.URL_ENV
DEFAULT_TOKEN_TTL_S = 30 * 24 * 3600  # node.trust.DEFAULT_TOKEN_TTL_S
NOT_IN_ONE_LINE = "\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029"  # node.core.models.NOT_IN_ONE_LINE
CA_FILE_ENV = "AGENT_REACH_CA_FILE"  # node.core.CA_FILE_ENV
CLIENT_CERT_FILE_ENV = "AGENT_REACH_CLIENT_CERT_FILE"  # node.core.CLIENT_CERT_FILE_ENV
CLIENT_KEY_FILE_ENV = "AGENT_REACH_CLIENT_KEY_FILE"  # node.core.CLIENT_KEY_FILE_ENV
TLS_ENV = (CA_FILE_ENV, CLIENT_CERT_FILE_ENV, CLIENT_KEY_FILE_ENV)  # with none set, https needs no node import
