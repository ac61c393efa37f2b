"""The OpenAPI 3.2 document of the v1 API, generated from the boundary models.

The document states what the node enforces, so that a request valid by it is accepted and
every answer conforms to it (``tests/http/test_fuzz.py`` runs schemathesis against a live node to
hold it to that):

* **Bodies** are the pydantic models' JSON schemas (validation mode), refined here with what
  their validators check but pydantic cannot write into a schema: URL syntax, PEP 440 versions
  and constraints, caller patterns, ``primary`` among the endpoints, dictionary keys outside
  the key pattern, bounded free-form JSON, "one of capability, agent_id or pattern" — and, for
  an A2A card, what the registration made from it must satisfy (see ``refinements``).
  What no schema can say is in the descriptions: two capabilities (or card skills) that give
  the same name and major version are a 422; an envelope past ``expire_at_ms`` is a 410.
* **Parameters** carry their patterns, ranges and enums (``agent_id`` is ``namespace.group.name``).
* **Responses** are listed per operation: exactly the statuses it can answer, each error with
  :class:`~node.core.models.ErrorBody`; ``/v1/watch`` documents each server-sent event (``hello``,
  ``change`` with a :class:`~node.core.models.ChangeEvent`, ``overflow``) with ``itemSchema``.
* **Routes** are the ones the node serves: ``build_openapi(region, served=…)`` drops what an
  attachment did not add (``/v1/federation/status`` without federation, the vectors route
  without discovery).

Answers the handlers write as dictionaries are described by small models (``shapes``); the
fuzz test fails when a handler and its model drift apart.

The generator, one part per module::

    document       build_openapi: the document, its paths filtered by what the node serves
    paths          every route and its operations (summaries, bodies, parameters, statuses)
    operations     the builders of an operation: responses, error entries, shared parameters
    components     the models' JSON schemas, refined, plus the composed ones (SendEnvelope, Reports)
    refinements    per model, what the validators check that pydantic cannot write
    patterns       the grammars (versions, constraints, IPv6, URLs) and shared schema fragments
    shapes         the answers the handlers write as dictionaries
    watch_events   the server-sent events of /v1/watch
"""

from __future__ import annotations

from .document import OPENAPI_VERSION, build_openapi
from .patterns import CONSTRAINT_PATTERN, IPV6_PATTERN, VERSION_PATTERN, stored_url_pattern, url_pattern

__all__ = ["CONSTRAINT_PATTERN", "IPV6_PATTERN", "OPENAPI_VERSION", "VERSION_PATTERN", "build_openapi",
           "stored_url_pattern", "url_pattern"]
