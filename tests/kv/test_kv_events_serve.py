"""KV events from a real `kvloop serve`, with either engine backend: the publisher lives where the KV manager
does (the engine core process, or the API process's engine thread), and a subscriber's mirror holds the
prompt's blocks with their token ids after one completion."""

from __future__ import annotations

import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from kv_events_sub import Subscriber, mirror
from live_process import running

from kvloop.engine.kv.kv_events import AllBlocksCleared, BlockStored

BLOCK = 16
PROMPT = "The tiered cache keeps what many requests share and lets the rest go. " * 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(tmp_path: Path, backend: str, *flags: str):
    port, log = _free_port(), tmp_path / "serve.log"
    kvloop = Path(sys.executable).with_name("kvloop")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    url = f"http://127.0.0.1:{port}"
    with running([str(kvloop), "serve", "--dtype", "float32", "--kv-cache-tokens", "4096", "--threads", "1",
                  "--host", "127.0.0.1", "--port", str(port), "--engine-backend", backend, *flags],
                 log, url + "/ready", "kvloop serve", env, ready_s=90):
        yield url


@pytest.mark.parametrize("backend", ["process", "thread"])
def test_a_served_completion_publishes_its_blocks(tmp_path, backend):
    pub, replay, topic = f"ipc://{tmp_path}/events", f"ipc://{tmp_path}/replay", "kv@pod-0@smol"
    with serving(tmp_path, backend, "--kv-events-endpoint", pub, "--kv-events-replay-endpoint", replay,
                 "--kv-events-topic", topic) as url:
        sub = Subscriber(pub, topic, replay)
        try:
            body = {"model": "default", "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
            ids = httpx.post(url + "/v1/completions/render", json=body, timeout=30).json()[0]["token_ids"]
            httpx.post(url + "/v1/completions", json=body, timeout=120).raise_for_status()
            held: dict = {}
            end = time.monotonic() + 30
            while len(held) < (len(ids) - 1) // BLOCK and time.monotonic() < end:
                sub.poll(1.0)
                if sub.batches:
                    sub.replay(0)  # what was sent before the subscription took hold
                    held = mirror(sub.events())
        finally:
            sub.close()
    events = sub.events()
    assert isinstance(events[0], AllBlocksCleared)
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert stored and all(e.medium == "GPU" and e.block_size == BLOCK for e in stored)
    # the chain from the root: the prompt's full blocks, token for token
    root = [h for h, (parent, _) in held.items() if parent is None]
    assert len(root) == 1
    chain, h = [], root[0]
    children = {parent: h for h, (parent, _) in held.items()}
    while h is not None:
        chain.extend(held[h][1])
        h = children.get(h)
    full = (len(ids) - 1) // BLOCK * BLOCK
    assert chain[:full] == ids[:full]
