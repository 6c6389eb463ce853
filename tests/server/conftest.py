"""One live server for the whole session: the embedded model in fp32 on one torch thread, a small KV pool,
uvicorn on 127.0.0.1 with a free port, run in a background thread. Its engine backend is kvloop serve's
default (the engine core in its own process), or KVLOOP_TEST_ENGINE_BACKEND (process or thread).
Functions run in the engine (LiveServer.in_engine) must pickle: module-level ones, or partials of them."""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import torch

from kvloop.engine.config import EngineConfig
from kvloop.engine.core.snapshot import EngineSnapshot
from kvloop.engine.engine_core import EngineCore
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.scheduler.scheduler import SchedulerConfig
from kvloop.engine.server.async_engine import AsyncEngine
from kvloop.engine.server.launch import (
    DEFAULT_ENGINE_BACKEND,
    build_process_server,
    build_server,
    uvicorn_config,
)
from kvloop.engine.server.limits import ConnectionLimits

torch.set_num_threads(1)

MAX_MODEL_LEN = 1024
KV_TOKENS = 4096
MAX_PENDING = 24
ENGINE_BACKEND = os.environ.get("KVLOOP_TEST_ENGINE_BACKEND", DEFAULT_ENGINE_BACKEND)


def engine_config() -> EngineConfig:
    return EngineConfig(dtype="float32", progress=False, kv_cache_tokens=KV_TOKENS,
                        kv=KVConfig(host_cache_tokens=KV_TOKENS),
                        scheduler=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=256,
                                                  max_model_len=MAX_MODEL_LEN))


def idle_state(e: EngineCore) -> tuple[EngineSnapshot, bool]:
    return e.snapshot(), e.has_unfinished()


def leak_check(e: EngineCore) -> tuple[int, int, int]:
    e.scheduler.check_integrity()
    held = sum(1 for rc in e.kv.pool.ref_counts if rc > 0) if hasattr(e.kv, "pool") else 0
    return held, len(e.scheduler.running), len(e.scheduler.waiting)


@dataclass
class LiveServer:
    url: str
    engine: EngineCore  # in-process, the serving engine's config and model: read its facts, not its state
    async_engine: AsyncEngine
    app: object
    protocol: type | None = None  # the guarded HTTP protocol class: tests may shorten its limits

    def wait_idle(self, timeout: float = 20.0) -> EngineSnapshot:
        """Until nothing is in flight and the engine holds no request; returns the last snapshot."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            snap, unfinished = self.in_engine(idle_state)
            if self.async_engine.num_in_flight == 0 and not unfinished:
                return snap
            time.sleep(0.05)
        raise AssertionError(f"engine not idle after {timeout} s: {self.async_engine.snapshot()}")

    def in_engine(self, fn):
        return self.async_engine.call_in_engine(fn).result(timeout=30)

    def assert_no_leak(self) -> None:
        """Integrity holds and no block is referenced: every block is free or (once the prefix cache lands)
        cached."""
        self.wait_idle()
        assert self.in_engine(leak_check) == (0, 0, 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_args(**overrides) -> argparse.Namespace:
    limits = ConnectionLimits()
    base = dict(max_pending=MAX_PENDING, request_timeout=60.0, served_model_name=None, api_key=None,
                allowed_origins=None, max_body_bytes=1 << 20, host="127.0.0.1", port=0, log_level="warning",
                header_timeout=limits.header_timeout_s, body_timeout=limits.body_timeout_s,
                keep_alive_timeout=5.0, max_connections=limits.max_connections)
    return argparse.Namespace(**{**base, **overrides})


@contextlib.contextmanager
def serve_in_thread(app, args: argparse.Namespace, lifespan: str = "off") -> Iterator[tuple[str, object]]:
    """uvicorn as kvloop serve configures it (guarded protocol, limits from args) on 127.0.0.1 and a free
    port, in a thread; yields (base url, uvicorn config). lifespan "off": the app's engine is not started."""
    import uvicorn

    port = _free_port()
    config = uvicorn_config(app, args, port=port, lifespan=lifespan)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, name=f"uvicorn-test-{port}", daemon=True)
    thread.start()
    end = time.monotonic() + 30
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < end, "the test server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", config
    finally:
        srv.should_exit = True
        thread.join(timeout=15)


@contextlib.contextmanager
def serve_ready(app, args: argparse.Namespace) -> Iterator[tuple[str, object]]:
    """serve_in_thread with the app's engine started; yields once /ready answers 200 (warmed up)."""
    with serve_in_thread(app, args, lifespan="on") as (url, config):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        else:
            raise RuntimeError("the test server did not become ready")
        yield url, config


@pytest.fixture(scope="session")
def core_engine(checkpoint, fp32_model, tokenizer) -> EngineCore:
    ckpt, model = checkpoint, fp32_model
    return EngineCore(engine_config(), model=model, tokenizer=tokenizer,
                      fingerprint=ckpt.fingerprint, model_name=ckpt.name)


@pytest.fixture(scope="session")
def server(core_engine, tokenizer) -> LiveServer:
    args = _serve_args()
    if ENGINE_BACKEND == "process":  # the core loads the same embedded model, in fp32, in its own process
        app, async_engine = build_process_server(engine_config(), args, tokenizer=tokenizer)
    else:
        app, async_engine = build_server(core_engine, args)
    async_engine.exit_on_death = False  # a dead engine here must fail tests, not end pytest's process
    with serve_ready(app, args) as (url, config):
        yield LiveServer(url, core_engine, async_engine, app, config.http)


@pytest.fixture(scope="session")
def http(server) -> httpx.Client:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="session")
def oai(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
