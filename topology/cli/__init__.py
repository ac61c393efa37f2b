"""The ``agent-reach`` command line, one module per subcommand.

Commands: ``node`` (:mod:`.node`: one region's node, drained on SIGTERM by :mod:`.drain`), ``up``
(:mod:`.up`: a whole topology on this machine), ``token`` (:mod:`.tokens`; ``token revoke``:
:mod:`.revoke`), the operator commands ``agents`` (:mod:`.agents`), ``resolve`` and ``search``
(:mod:`.lookup`) and ``watch`` (:mod:`.watch`) on :mod:`.operator` (options, output; the HTTP client
:mod:`.nodeclient`, the exit codes :mod:`.exitcodes`), and the agent-side tools, which use only
the SDK ``node.client``: ``register`` (:mod:`.register`), ``preflight`` (:mod:`.preflight`) and
``sidecar`` (:mod:`.sidecar`). Shared by them: :mod:`.options` (secret and data-dir flags),
:mod:`.console` (what is printed), :mod:`.nodenames` (node's names needed before importing node),
:mod:`.signals` (SIGINT/SIGTERM — only the command line installs signal handlers) and
:mod:`.runtime` (the event loop). :mod:`.entrypoint` imports a command's module only when that
command is given.

``agent-reach`` runs :func:`main`; ``python -m topology.cli`` does the same (the launcher starts
its node processes that way).
"""

from .entrypoint import build_parser, main

__all__ = ["build_parser", "main"]
