"""The FastAPI app: OpenAI routes, probes, /metrics. `build_app` wires an AsyncEngine into it; the engine
thread starts with the app's lifespan (or earlier, when the caller started it)."""

from __future__ import annotations

import contextlib
import time

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvloop.engine.server import errors, render, server_info
from kvloop.engine.server.async_engine import AsyncEngine
from kvloop.engine.server.chat import create_chat_completion
from kvloop.engine.server.completions import create_completion
from kvloop.engine.server.errors import APIError, error_response
from kvloop.engine.server.metrics import EngineMetrics
from kvloop.engine.server.middleware import APIKey, BodyLimit
from kvloop.engine.server.protocol import ChatCompletionRequest, CompletionRequest
from kvloop.engine.server.serving import ServerSettings

ERROR_RESPONSES = {code: {"description": text} for code, text in (
    (400, "invalid request"), (404, "unknown model"), (408, "deadline exceeded"), (413, "body too large"),
    (429, "overloaded (Retry-After)"), (503, "not ready"))}


def build_app(engine: AsyncEngine, metrics: EngineMetrics, settings: ServerSettings | None = None,
              api_key: str | None = None, cors_origins: list[str] | None = None,
              max_body_bytes: int = 1 << 20, shutdown_engine: bool = True) -> FastAPI:
    settings = settings or ServerSettings()
    started = time.time()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if engine._thread is None:
            engine.start()
        yield
        if shutdown_engine:
            engine.shutdown()

    app = FastAPI(title="kvloop", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible API of the kvloop engine")
    errors.install(app)
    app.state.settings = settings  # live: tests and operators may change the deadline
    app.state.engine = engine

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": int(started), "owned_by": "kvloop",
                "root": engine.model_name, "max_model_len": engine.max_model_len}

    @app.get("/v1/models")
    async def list_models():
        names = [engine.model_name, *[n for n in settings.served_names if n != engine.model_name]]
        return {"object": "list", "data": [model_card(n) for n in names]}

    @app.get("/v1/models/{model:path}", responses={404: ERROR_RESPONSES[404]})
    async def get_model(model: str):
        if model != engine.model_name and model not in settings.served_names:
            raise APIError(404, f"The model `{model}` does not exist.", "model", "model_not_found")
        return model_card(model)

    @app.post("/v1/chat/completions", responses=ERROR_RESPONSES)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await create_chat_completion(body, request, engine, settings)

    @app.post("/v1/completions", responses=ERROR_RESPONSES)
    async def completions(body: CompletionRequest, request: Request):
        return await create_completion(body, request, engine, settings)

    render.install(app, engine, settings)  # /v1/*/render, /tokenize, /detokenize: what routers call
    server_info.install(app, engine, settings)  # /get_server_info, /kv_event_sources, /server_info

    @app.get("/health", responses={503: ERROR_RESPONSES[503]})
    async def health():
        if engine.dead:
            return error_response(503, engine.dead, code="engine_dead")
        return {"status": "ok"}

    @app.get("/ready", responses={503: ERROR_RESPONSES[503]})
    async def ready():
        if engine.draining:
            return error_response(503, "the server is shutting down", code="shutting_down")
        if not engine.ready:
            return error_response(503, engine.dead or "the engine is starting", code="not_ready")
        return {"status": "ready", "model": engine.model_name}

    @app.get("/metrics")
    async def metrics_endpoint():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    async def root():
        return JSONResponse({"service": "kvloop", "model": engine.model_name, "docs": "/docs"})

    # added last = outermost: CORS (off by default), then the API key, then the body limit
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    if api_key:
        app.add_middleware(APIKey, key=api_key)
    if cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=cors_origins, allow_methods=["*"],
                           allow_headers=["*"])
    return app
