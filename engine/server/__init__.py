"""OpenAI-compatible HTTP server (FastAPI + uvicorn) over the engine, with Prometheus metrics."""
