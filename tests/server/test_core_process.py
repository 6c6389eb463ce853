"""The engine core in its own process (kvloop serve's default backend): if it dies, from an exception in its
loop or killed, the API process fails what is in flight, says why on /health (503, Retry-After) and exits
with status 70 so that it is restarted. Real server processes, real HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import psutil

from kvloop.engine.bench.ready import wait_ready
from kvloop.engine.server.async_engine import EXIT_ENGINE_DEAD

TESTS = Path(__file__).resolve().parents[1]
SERVER = """
import sys
sys.path.insert(0, sys.argv[2])
import uvicorn
from server.conftest import _serve_args
from server.core_faults import broken_scheduler_core
from kvloop.engine.config import EngineConfig
from kvloop.engine.server.launch import build_process_server

if __name__ == "__main__":
    args = _serve_args(max_pending=8, request_timeout=None)
    config = EngineConfig(dtype="float32", progress=False, kv_cache_tokens=1024)
    app, _ = build_process_server(config, args, build=broken_scheduler_core)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(proc: subprocess.Popen, url: str) -> None:
    try:
        wait_ready(proc, f"{url}/ready", timeout_s=120)
    except (RuntimeError, TimeoutError) as exc:
        output = proc.stdout.read() if proc.stdout else ""
        raise AssertionError(f"the server did not become ready: {exc}: {output}") from exc


def _assert_dead(url: str, reason: str) -> None:
    health = httpx.get(f"{url}/health", timeout=5)  # within the exit grace: the reason is visible
    assert health.status_code == 503 and reason in health.json()["error"]["message"], health.text
    assert int(health.headers["retry-after"]) >= 1


def test_an_exception_in_the_core_loop_fails_in_flight_reports_and_exits_70():
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(TESTS)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, url)
        resp = httpx.post(f"{url}/v1/completions", json={"model": "default", "prompt": "hi", "max_tokens": 2},
                          timeout=30)
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "engine_unavailable", resp.text
        assert int(resp.headers["retry-after"]) >= 1
        _assert_dead(url, "scheduler bug")
        assert proc.wait(timeout=30) == EXIT_ENGINE_DEAD
        assert "exiting with status" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_killed_core_fails_the_stream_reports_and_exits_70(tmp_path):
    port = _free_port()
    kvloop = Path(sys.executable).with_name("kvloop")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(kvloop), "serve", "--dtype", "float32", "--kv-cache-tokens", "4096",
                                 "--host", "127.0.0.1", "--port", str(port), "--engine-backend", "process"],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, url)
        # the core, not multiprocessing's resource tracker
        (core,) = [c for c in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
        body = {"model": "default", "prompt": "Count: one two three", "max_tokens": 900, "stream": True,
                "ignore_eos": True, "temperature": 0}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as resp:
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")  # generating
            os.kill(core.pid, signal.SIGKILL)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and "engine_unavailable" in rest[-2], rest[-3:]
        _assert_dead(url, "exited")
        assert proc.wait(timeout=30) == EXIT_ENGINE_DEAD, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
