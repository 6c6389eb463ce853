"""What a request asks for in `response_format`, parsed once at the API edge into a hashable spec that
SamplingParams carries (no torch, no grammar library here: the scheduler side imports this)."""

from __future__ import annotations

import json
from dataclasses import dataclass

MAX_SCHEMA_CHARS = 64 * 1024  # a schema's JSON text; larger ones are refused before any compiling
ANY_OBJECT = '{"type":"object"}'  # json_object: any JSON object


@dataclass(frozen=True)
class GrammarSpec:
    kind: str  # "json_object" or "json_schema"
    schema: str  # the schema as compact JSON text: the grammar cache's key

    @property
    def key(self) -> str:
        return self.schema


def parse_response_format(value) -> GrammarSpec | None:
    """OpenAI's response_format: {"type": "text"} (or None) -> None; {"type": "json_object"};
    {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}. A ValueError names
    response_format and says what is wrong."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("response_format must be an object with a 'type'")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec("json_object", ANY_OBJECT)
    if kind != "json_schema":
        raise ValueError(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}")
    body = value.get("json_schema")
    if not isinstance(body, dict):
        raise ValueError("response_format.json_schema must be an object with a 'name' and a 'schema'")
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or not 0 < len(name) <= 64):
        raise ValueError("response_format.json_schema.name must be a string of 1 to 64 characters")
    if "strict" in body and body["strict"] is not None and not isinstance(body["strict"], bool):
        raise ValueError("response_format.json_schema.strict must be a boolean")
    schema = body.get("schema")
    if not isinstance(schema, dict):
        raise ValueError("response_format.json_schema.schema must be a JSON Schema object")
    # compact but in the client's key order: the order of "properties" is the order they are generated in
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    if len(text) > MAX_SCHEMA_CHARS:
        raise ValueError(f"response_format.json_schema.schema must be at most {MAX_SCHEMA_CHARS} characters "
                         f"as JSON, got {len(text)}")
    return GrammarSpec("json_schema", text)
