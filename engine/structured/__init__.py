"""Structured outputs: a request's response_format becomes a grammar (llguidance) whose per-step token
mask constrains sampling. kvloop.engine.core.grammar_spec is what a request asks (no torch, no library);
compiler.py turns it into a grammar, cached by the schema text, and refuses a schema with no document
(finite.py: $ref cycles with no way out); matcher.py is one request's state; processor.py plugs the masks
into the sampler's logits processors; bitmask.py applies them."""
