"""vllm-router 0.1.17's kv_aware policy in front of two live `kvloop serve` replicas that publish KV events:
the router subscribes to each replica's events (static sources: --kv-event-source URL=tcp://HOST:PORT with
the replica's PUB socket bound, topic "", --kv-event-model, --kv-event-block-size), hashes the token ids the
replica's /v1/completions/render gives it, and credits the blocks a replica's events say it holds. A prompt
the router never saw, sent straight to one replica, is routed to that replica afterwards; a repeated prompt
is a placement hit in the router's /metrics. Skipped when the vllm-router binary is missing."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from live_process import router_binary, running

from kvloop.engine.kv.kv_events import BlockStored

from .conftest import _free_port

sys.path.insert(0, str(Path(__file__).parents[1] / "kv"))
from kv_events_sub import Subscriber  # noqa: E402  (the KV tests' subscriber)

BLOCK = 16
MODEL = "default"  # the name clients send; the router keys its block index by --kv-event-model


class Fleet:
    def __init__(self, replicas: list[str], events: list[str], router: str, router_metrics: str):
        self.replicas, self.events = replicas, events
        self.router, self.router_metrics = router, router_metrics


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[Fleet]:
    binary = router_binary()
    if binary is None:
        pytest.skip("vllm-router is not installed")
    tmp = tmp_path_factory.mktemp("kv_aware")
    kvloop = Path(sys.executable).with_name("kvloop")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    ports = [_free_port() for _ in range(2)]
    event_ports = [_free_port() for _ in range(2)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    events = [f"tcp://127.0.0.1:{p}" for p in event_ports]
    with ExitStack() as stack:
        for i in range(2):
            # The PUB socket binds (vLLM's rule: a wildcard address binds, any other is connected to) and the
            # router's SUB connects to it; static sources subscribe to the empty topic only.
            stack.enter_context(running(
                [str(kvloop), "serve", "--dtype", "float32", "--kv-cache-tokens", "4096", "--threads", "1",
                 "--host", "127.0.0.1", "--port", str(ports[i]), "--engine-backend", "thread",
                 "--block-size", str(BLOCK), "--kv-events-endpoint", f"tcp://*:{event_ports[i]}",
                 "--kv-events-topic", ""],
                tmp / f"serve{i}.log", urls[i] + "/ready", f"kvloop serve {i}", env))
        port, metrics_port = _free_port(), _free_port()
        sources = [arg for url, ep in zip(urls, events, strict=True)
                   for arg in ("--kv-event-source", f"{url}={ep}")]
        router_url = f"http://127.0.0.1:{port}"
        stack.enter_context(running(
            [binary, "--host", "127.0.0.1", "--port", str(port), "--policy", "kv_aware",
             "--prometheus-port", str(metrics_port), "--health-check-endpoint", "/ready",
             "--worker-urls", *urls, *sources, "--kv-event-block-size", str(BLOCK),
             "--kv-event-model", MODEL, "--log-level", "warning"],
            tmp / "router.log", router_url + "/v1/models", "vllm-router"))
        yield Fleet(urls, events, router_url, f"http://127.0.0.1:{metrics_port}/metrics")


def _completion(url: str, prompt: str) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def _served(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(r'^vllm:request_success_total\{[^}]*\} (\S+)$', text, re.M))


def _placement(fleet: Fleet, result: str) -> float:
    text = httpx.get(fleet.router_metrics, timeout=10).text
    found = re.search(rf'^vllm_router_kv_placement_lookups_total\{{result="{result}"\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def _seed(fleet: Fleet, i: int, prompt: str) -> None:
    """Runs `prompt` on replica i directly (the router never sees it) and waits until that replica's events
    carry its blocks: what the router's own subscriber receives at the same time."""
    sub = Subscriber(fleet.events[i], "")
    try:
        time.sleep(0.2)  # a SUB socket misses what is sent before its subscription reaches the publisher
        _completion(fleet.replicas[i], prompt)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            sub.poll(1.0)
            stored = [e for e in sub.events() if isinstance(e, BlockStored)]
            if sum(len(e.block_hashes) for e in stored) >= 2:
                break
        else:
            pytest.fail(f"replica {i} published no stored blocks")
    finally:
        sub.close()
    time.sleep(0.2)  # the router's subscriber polls every 10 ms; nothing it exposes says a batch is applied


def _prompt(tag: str) -> str:
    return f"Conversation {tag}: the tiered cache keeps what many requests share and lets the rest go. " * 3


def test_a_prompt_goes_to_the_replica_whose_events_hold_it(fleet):
    for i in (1, 0):  # each replica in turn, so that neither load balance nor luck explains the choice
        prompt = _prompt(f"seeded on {i}")
        _seed(fleet, i, prompt)
        before = [_served(u) for u in fleet.replicas]
        hits = _placement(fleet, "hit")
        _completion(fleet.router, prompt)
        after = [_served(u) for u in fleet.replicas]
        assert [a - b for a, b in zip(after, before, strict=True)] == [float(j == i) for j in range(2)]
        assert _placement(fleet, "hit") == hits + 1


def test_a_repeated_conversation_stays_on_its_replica(fleet):
    prompt = _prompt("repeated")
    _completion(fleet.router, prompt)  # the first turn goes where load says; its blocks are then published
    time.sleep(0.5)  # the events' batch reaches the router (no signal of its own)
    before = [_served(u) for u in fleet.replicas]
    hits = _placement(fleet, "hit")
    for _ in range(3):
        _completion(fleet.router, prompt)
    after = [_served(u) for u in fleet.replicas]
    assert sorted(a - b for a, b in zip(after, before, strict=True)) == [0.0, 3.0]
    assert _placement(fleet, "hit") == hits + 3


def test_each_replica_describes_its_event_source(fleet):
    """What vllm-router's discovery asks a worker (engine/server/server_info.py): one identity per replica,
    the block size, and rank 0's KVEventsConfig as vLLM names its fields."""
    infos = [httpx.get(u + "/get_server_info", timeout=10).json() for u in fleet.replicas]
    assert [i["kv_block_size"] for i in infos] == [BLOCK, BLOCK]
    assert {i["model_id"] for i in infos} == {MODEL} and infos[0]["instance_id"] != infos[1]["instance_id"]
    for url, endpoint in zip(fleet.replicas, fleet.events, strict=True):
        source = httpx.get(url + "/kv_event_sources", timeout=10).json()["0"]
        assert source["endpoint"] == endpoint.replace("127.0.0.1", "*") and source["topic"] == ""
        assert source["enable_kv_cache_events"] and source["publisher"] == "zmq"
        config = httpx.get(url + "/server_info", params={"config_format": "json"}, timeout=10).json()
        assert config["vllm_config"]["cache_config"]["block_size"] == BLOCK
        assert config["vllm_config"]["kv_events_config"] == source
        assert isinstance(httpx.get(url + "/server_info", timeout=10).json()["vllm_config"], str)


def test_a_replica_without_events_has_no_event_source(server):
    assert httpx.get(server.url + "/kv_event_sources", timeout=10).status_code == 404
    info = httpx.get(server.url + "/get_server_info", timeout=10).json()
    assert info["kv_block_size"] > 0 and info["instance_id"]
