"""If the engine thread dies anyway (a fault no request caused: here a scheduler that raises), the real
server process fails the request in flight, says so on /health, and exits non-zero at once so that the
kubelet (or `make serve`) restarts it, instead of lingering half-alive."""

from __future__ import annotations

import socket
import subprocess
import sys

import httpx

from kvloop.engine.bench.ready import wait_ready
from kvloop.engine.server.async_engine import EXIT_ENGINE_DEAD

SERVER = """
import argparse, sys, torch, uvicorn
from kvloop.engine.config import EngineConfig
from kvloop.engine.engine_core import WARMUP_REQUEST_ID, EngineCore
from kvloop.engine.server.launch import build_server

torch.set_num_threads(1)
engine = EngineCore(EngineConfig(dtype="float32", progress=False, kv_cache_tokens=1024))
schedule = engine.scheduler.schedule

def broken():  # the warm-up request goes through; the first client request meets a scheduler bug
    if any(s.request_id != WARMUP_REQUEST_ID for s in engine.scheduler.waiting):
        raise RuntimeError("scheduler bug")
    return schedule()

engine.scheduler.schedule = broken
args = argparse.Namespace(max_pending=8, request_timeout=None, served_model_name=None, api_key=None,
                          allowed_origins=None, max_body_bytes=1 << 20)
app, _ = build_server(engine, args)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_engine_death_fails_in_flight_reports_and_exits_nonzero():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_ready(proc, f"{url}/ready", timeout_s=120)
        except (RuntimeError, TimeoutError) as exc:
            raise AssertionError(f"{exc}: {proc.stdout.read()}") from exc
        body = {"model": "default", "prompt": "hi", "max_tokens": 2}
        resp = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "engine_unavailable"
        health = httpx.get(f"{url}/health", timeout=5)  # within the exit grace: the reason is visible
        assert health.status_code == 503 and "scheduler bug" in health.json()["error"]["message"]
        assert int(resp.headers["retry-after"]) >= 1 and int(health.headers["retry-after"]) >= 1
        assert proc.wait(timeout=30) == EXIT_ENGINE_DEAD
        assert "exiting with status" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
