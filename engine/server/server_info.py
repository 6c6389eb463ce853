"""What a router asks a replica about itself before it subscribes to the replica's KV events, in the shapes
vllm-router reads:

- GET /get_server_info: {model_id, model_path, instance_id, kv_block_size, ...}. vllm-router 0.1.17's
  kv_aware policy (src/kv_index/discovery.rs) keys its block index by (model, block size) and each publisher
  by instance_id, which must differ between replicas; without this endpoint it falls back to the worker URL
  and creates no index ("cannot create cache identity").
- GET /kv_event_sources: one entry per data-parallel rank ({"0": {...}}), the fields of vLLM's
  KVEventsConfig (endpoint, replay_endpoint, topic, hwm, buffer_steps, publisher, enable_kv_cache_events).
  The router connects a SUB socket to `endpoint` (a bind address's `*` or 0.0.0.0 replaced by the worker's
  host) and subscribes to `topic`. 404 when this replica publishes no events (the router skips it).
- GET /server_info[?config_format=json]: vLLM's {"vllm_config": ...}, the facts above under vLLM's config
  names (model_config.model, cache_config.block_size, kv_events_config), as text by default.

Discovery through these replaces the router's static flags (--kv-event-source, --kv-event-model,
--kv-event-block-size), which subscribe with the empty topic only."""

from __future__ import annotations

import json
import uuid

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from kvloop.engine.kv.kv_events import expanded_topic
from kvloop.engine.server.async_engine import AsyncEngine
from kvloop.engine.server.serving import ServerSettings


def engine_config(engine: AsyncEngine):
    """The EngineConfig behind either backend: the process backend keeps the one it started its core with,
    the thread backend's engine core holds its own."""
    config = getattr(engine, "_config", None)
    return config if config is not None else engine.engine.config


def kv_event_source(config) -> dict | None:
    """Rank 0's KVEventsConfig as vLLM names its fields, or None when events are off."""
    kv = config.kv
    if not kv.kv_events_endpoint:
        return None
    # zmq is imported only where events are on
    from kvloop.engine.kv.events_publisher import DEFAULT_REPLAY_BATCHES, SEND_HWM

    return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": kv.kv_events_endpoint,
            "replay_endpoint": kv.kv_events_replay_endpoint or None,
            "topic": expanded_topic(kv.kv_events_topic),
            "buffer_steps": DEFAULT_REPLAY_BATCHES, "hwm": SEND_HWM}


def install(app: FastAPI, engine: AsyncEngine, settings: ServerSettings) -> None:
    instance_id = uuid.uuid4().hex  # one per server: two replicas must never share a publisher identity

    def model_id() -> str:
        # the name clients send, which the router's block index is keyed by
        return settings.served_names[0] if settings.served_names else engine.model_name

    @app.get("/get_server_info")
    async def get_server_info():
        config = engine_config(engine)
        return {"model_id": model_id(), "model_path": config.model or engine.model_name,
                "served_model_name": model_id(), "instance_id": instance_id,
                "kv_block_size": config.block_size, "max_model_len": engine.max_model_len}

    @app.get("/kv_event_sources", responses={404: {"description": "this replica publishes no KV events"}})
    async def kv_event_sources():
        source = kv_event_source(engine_config(engine))
        if source is None:
            return JSONResponse({"error": "this replica publishes no KV events"}, status_code=404)
        return {"0": source}

    @app.get("/server_info")
    async def server_info(config_format: str = "text"):
        config = engine_config(engine)
        vllm_config = {
            "model_config": {"model": model_id(), "served_model_name": model_id(),
                             "max_model_len": engine.max_model_len},
            "cache_config": {"block_size": config.block_size, "enable_prefix_caching": True},
            "kv_events_config": kv_event_source(config) or {"enable_kv_cache_events": False,
                                                             "publisher": "null"}}
        return {"vllm_config": vllm_config if config_format == "json" else json.dumps(vllm_config)}
