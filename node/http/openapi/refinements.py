"""What pydantic cannot write into a model's schema, written here: per model, the property
schemas that replace the generated ones (URLs, versions, caller patterns, closed key patterns,
bounded JSON, the limits an A2A card carries into its registration).
"""

from __future__ import annotations

import copy

from .patterns import (
    AGENT_PATTERN,
    CALLER_PATTERN,
    CONSTRAINT_DESCRIPTION,
    CONSTRAINT_PATTERN,
    ENDPOINT_URL,
    JSON_REF,
    LABELS,
    MULTI_LINE,
    NODE_URL,
    SHORT_TEXT,
    SINGLE_LINE,
    STORED_ENDPOINT_URL,
    STORED_NODE_URL,
    VERSION_PATTERN,
    Schema,
)

# Model → field → the property schema that replaces pydantic's (an optional field keeps its null).
_REGISTRATION_REFINEMENTS: dict[str, Schema] = {
    "endpoints": {"type": "object", "required": ["primary"], "minProperties": 1, "maxProperties": 16,
                  "propertyNames": {"pattern": "^[a-z][a-z0-9_-]{0,31}$"}, "additionalProperties": ENDPOINT_URL,
                  "description": "Named endpoints; 'primary' is required.",
                  "examples": [{"primary": "http://127.0.0.1:9000"}]},
    "callback_endpoint": {"anyOf": [NODE_URL, {"type": "null"}], "default": None},
    "labels": {**LABELS, "default": {}},
    "allowed_callers": {"type": "array", "maxItems": 64, "default": [],
                        "items": {"type": "string", "maxLength": 200, "pattern": CALLER_PATTERN},
                        "description": "Caller patterns allowed to see and resolve this agent "
                                       "('payment.*.*', 'admin'); empty = anyone."},
    "capabilities": {"type": "array", "maxItems": 64, "default": [],
                     "items": {"$ref": "#/components/schemas/Capability"},
                     "description": "Two capabilities with the same name and major version are a 422."},
}
# A record is what the node stored: its URLs are described by what every accepted URL is.
_RECORD_REFINEMENTS: dict[str, Schema] = {
    **_REGISTRATION_REFINEMENTS,
    "endpoints": {**_REGISTRATION_REFINEMENTS["endpoints"], "additionalProperties": STORED_ENDPOINT_URL},
    "callback_endpoint": {"anyOf": [STORED_NODE_URL, {"type": "null"}], "default": None},
    "liveness_probe": {"anyOf": [{"$ref": "#/components/schemas/ProbeRecord"}, {"type": "null"}], "default": None},
    "readiness_probe": {"anyOf": [{"$ref": "#/components/schemas/ProbeRecord"}, {"type": "null"}], "default": None},
}
_RECORDED_EXTENSIONS: Schema = {
    "anyOf": [{"type": "object", "maxProperties": 64, "propertyNames": {"maxLength": 200},
               "additionalProperties": JSON_REF}, {"type": "null"}], "default": None,
    "description": "The envelope's extensions, secret-looking values kept to their last 4 characters."}
REFINEMENTS: dict[str, dict[str, Schema]] = {
    "Registration": _REGISTRATION_REFINEMENTS,
    "AgentRecord": _RECORD_REFINEMENTS,
    "Capability": {"version": {"type": "string", "maxLength": 40, "pattern": VERSION_PATTERN, "default": "1",
                               "description": "A PEP 440 version; 'v2' and '2' are the same."},
                   "allowed_callers": {**_REGISTRATION_REFINEMENTS["allowed_callers"],
                                       "description": "Caller patterns allowed to be routed to this capability "
                                                      "('payment.*.*', 'admin'); empty = whoever may see the agent."}},
    "AclRule": {"agents": {"type": "string", "maxLength": 200, "pattern": AGENT_PATTERN,
                           "description": "namespace.group.name with '*' wildcards within a segment"},
                "callers": {"type": "array", "minItems": 1, "maxItems": 64,
                            "items": {"type": "string", "maxLength": 200, "pattern": CALLER_PATTERN}}},
    "Probe": {"url": NODE_URL},
    "RouteRequest": {
        "version": {"anyOf": [{"type": "string", "maxLength": 100, "pattern": CONSTRAINT_PATTERN}, {"type": "null"}],
                    "default": None, "description": CONSTRAINT_DESCRIPTION},
        "pattern": {"anyOf": [{"type": "string", "maxLength": 200, "pattern": AGENT_PATTERN}, {"type": "null"}],
                    "default": None, "description": "namespace.group.name with '*' wildcards within a segment"},
    },
    "RouteEvent": {"extensions": _RECORDED_EXTENSIONS},
    "TraceEvent": {"extensions": _RECORDED_EXTENSIONS},
    "Envelope": {
        "payload": {**JSON_REF, "default": None},
        "extensions": {"type": "object", "maxProperties": 64, "propertyNames": {"maxLength": 200},
                       "additionalProperties": JSON_REF, "default": {},
                       "description": "Cross-cutting context (user_id, conversation_id, locale …)."},
    },
}
# A card becomes a Registration (node.core.a2a.card_to_registration): its name the display name,
# its description the description, each skill a capability (tags, examples, and the skill's
# name as the description when it has none), each interface an endpoint, protocol versions and
# the provider labels. So the card's fields carry the registration's limits.
_OPTIONAL_PROSE = {"anyOf": [{"type": "string", "maxLength": 4_000, **MULTI_LINE}, {"type": "null"}], "default": None}
# gRPC's host:port, which a GRPC interface may give instead of a URL (node.core.a2a.card.card_url).
HOST_PORT = {"type": "string", "maxLength": 2_000,
             "pattern": "^(?:[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}|\\[[0-9A-Fa-f:.]{2,45}\\]):[0-9]{1,5}$"}


def _free_object(max_properties: int) -> Schema:
    return {"type": "object", "maxProperties": max_properties, "propertyNames": {"maxLength": 200},
            "additionalProperties": JSON_REF}


# A link a client may follow: http(s) only (node.core.a2a.card.WebUrl).
_WEB_URL = {"anyOf": [{**NODE_URL, "description": "An http(s) link"}, {"type": "null"}], "default": None}
CARD_REFINEMENTS: dict[str, dict[str, Schema]] = {
    "OAuthFlow": {name: _WEB_URL for name in ("authorizationUrl", "tokenUrl", "refreshUrl", "deviceAuthorizationUrl")},
    "SchemeDetails": {"oauth2MetadataUrl": _WEB_URL, "openIdConnectUrl": _WEB_URL},
    "SecurityScheme": {"oauth2MetadataUrl": _WEB_URL, "openIdConnectUrl": _WEB_URL},
    "AgentCard": {
        "iconUrl": _WEB_URL,
        "documentationUrl": _WEB_URL,
        "name": {**SHORT_TEXT, "minLength": 1},
        "description": _OPTIONAL_PROSE,
        "url": {"anyOf": [ENDPOINT_URL, HOST_PORT, {"type": "null"}], "default": None},
        "protocolVersion": {"anyOf": [{"type": "string", "maxLength": 32, **SINGLE_LINE}, {"type": "null"}],
                            "default": None},
        # One endpoint for the preferred interface, at most 16 in all.
        "additionalInterfaces": {"anyOf": [{"type": "array", "maxItems": 15,
                                            "items": {"$ref": "#/components/schemas/AgentInterface"}},
                                           {"type": "null"}], "default": None},
    },
    "AgentInterface": {
        "url": {"anyOf": [ENDPOINT_URL, HOST_PORT],
                "description": "An absolute URL; a GRPC interface may give host:port"},
        "protocolVersion": {"anyOf": [{"type": "string", "maxLength": 32, **SINGLE_LINE}, {"type": "null"}],
                            "default": None},
    },
    "AgentSkill": {
        "description": _OPTIONAL_PROSE,
        "tags": {"anyOf": [{"type": "array", "maxItems": 32, "items": {"type": "string", "maxLength": 64,
                                                                         **SINGLE_LINE}}, {"type": "null"}],
                 "default": None},
        "examples": {"anyOf": [{"type": "array", "maxItems": 16, "items": {"type": "string", "maxLength": 500,
                                                                             **MULTI_LINE}}, {"type": "null"}],
                     "default": None},
    },
    "AgentProvider": {"organization": {**SHORT_TEXT}, "url": _WEB_URL},
    # Free-form JSON in a card is bounded like any other (node.core.models.check_json_value).
    "AgentExtension": {"params": {"anyOf": [_free_object(64), {"type": "null"}], "default": None}},
    "AgentCardSignature": {"header": {"anyOf": [_free_object(32), {"type": "null"}], "default": None}},
    # Two labels are added: a2a.protocol_version and a2a.provider.
    "CardRegistration": {"labels": {**LABELS, "maxProperties": 62, "default": {}},
                         "allowed_callers": _REGISTRATION_REFINEMENTS["allowed_callers"]},
}


def refine(schemas: dict[str, Schema], refinements: dict[str, dict[str, Schema]]) -> None:
    for name, fields in refinements.items():
        properties = schemas[name]["properties"]
        for field, schema in fields.items():
            kept = {key: properties[field][key] for key in ("title",) if key in properties[field]}
            properties[field] = {**kept, **copy.deepcopy(schema)}


def close_pattern_properties(schema: object) -> None:
    """pydantic writes a dict with a key pattern as ``patternProperties`` alone, which admits any
    other key; the model refuses them, so say so."""
    if isinstance(schema, dict):
        if "patternProperties" in schema and "additionalProperties" not in schema:
            (pattern, values), = schema.pop("patternProperties").items()
            schema["propertyNames"] = {"pattern": pattern}
            schema["additionalProperties"] = values
        for value in schema.values():
            close_pattern_properties(value)
    elif isinstance(schema, list):
        for value in schema:
            close_pattern_properties(value)
