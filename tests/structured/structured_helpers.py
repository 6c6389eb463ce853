"""What the structured-output tests share besides fixtures: a small schema and its GrammarSpec."""

from __future__ import annotations

import json

from kvloop.engine.core.grammar_spec import GrammarSpec

# Small enough that its JSON completes in a few dozen tokens, strict enough to check.
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "city": {"enum": ["Paris", "Rome", "Oslo"]}},
          "required": ["name", "age", "city"], "additionalProperties": False}
PERSON_SPEC = GrammarSpec("json_schema", json.dumps(PERSON, separators=(",", ":")))
