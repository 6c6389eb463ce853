"""The sidecar's HTTP app: /healthz, /metrics (kvloop:feedback_*), /status (recent decisions)."""

from __future__ import annotations

from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvloop.sidecar.coordinator import Coordinator
from kvloop.sidecar.metrics import build_registry


def build_app(coordinator: Coordinator, alive=lambda: True) -> FastAPI:
    app = FastAPI(title="kvloop sidecar", docs_url=None, redoc_url=None)
    registry = build_registry(coordinator)

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        # Healthy while the coordinator loop runs; a stale engine is reported, not fatal.
        ok = bool(alive())
        return JSONResponse({"ok": ok, "mode": coordinator.settings.mode, "stale": coordinator.stale},
                            status_code=200 if ok else 503)

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/status")
    def status(limit: int = Query(50, ge=1, le=200)) -> JSONResponse:
        return JSONResponse(coordinator.status(limit))

    return app
