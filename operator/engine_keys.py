"""engine.yaml keys of the engine options the operator sets beyond its original ones, by their agreed flag.

The pod runs `kvloop serve --config engine.yaml`, which replaces the engine flags, so every option reaches
the engine as a settings-file key. The operator may not import the engine's config (the import contract
in pyproject.toml), so the keys are written here once; tests/operator/test_engine_keys.py holds each one
to the `setting` the engine declares for the same flag (once the engine declares it).
"""

from __future__ import annotations

from typing import Any

# flag -> dotted engine.yaml key
SETTING_KEYS: dict[str, str] = {
    "--kv-remote-url": "kv_cache.remote_url",
    "--kv-remote-timeout-ms": "kv_cache.remote_timeout_ms",
    "--kv-events-endpoint": "kv_events.endpoint",
    "--kv-events-topic": "kv_events.topic",
    "--kv-events-hash": "kv_events.hash",
    "--kv-events-hash-seed": "kv_events.hash_seed",
    "--kv-events-encoding": "kv_events.encoding",
    "--speculation": "speculation",
}


def put(config: dict[str, Any], flag: str, value: Any) -> None:
    """Set the engine.yaml key of `flag` in the rendered config (sections created as needed)."""
    *sections, key = SETTING_KEYS[flag].split(".")
    node = config
    for section in sections:
        node = node.setdefault(section, {})
    node[key] = value
