"""The remote KV tier's client against a real redis-server: round trip, namespaces, damaged values as misses,
a dead or silent store as misses with one log line and an error count, URL checks, and the price of a slow
link deciding for recomputation."""

from __future__ import annotations

import logging
import socket

import pytest
import torch
from remote_redis import RedisServer, free_port, wait_for

from kvloop.engine.core.kv_stats import KVStats
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.kv.load_or_recompute import TierCosts
from kvloop.engine.kv.remote_client import RemoteKV
from kvloop.engine.kv.remote_tier import PASSWORD_ENV, block_key, open_store
from kvloop.engine.kv.tier_mover import TierMover

SHAPE = [2, 2, 4, 1, 8]  # layers, K/V, tokens, heads, head dim
NBYTES = 2 * 2 * 4 * 1 * 8 * 4  # float32


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = RedisServer(tmp_path_factory.mktemp("redis"))
    yield s
    s.kill()


def client(url: str, dtype: str = "float32", shape=SHAPE, fingerprint: str = "model-a",
           timeout_s: float = 2.0) -> RemoteKV:
    return RemoteKV(open_store(url, timeout_s, None), url, fingerprint, dtype, shape, KVStats(), TierCosts())


def payload(seed: int) -> memoryview:
    return memoryview(bytes((seed + i) % 251 for i in range(NBYTES)))


def test_round_trip(server):
    writer = client(server.url)
    assert writer.put(11, payload(1)) and writer.put(12, payload(2))
    assert writer.flush(10) and writer.stats.remote_writes == 2
    assert server.client().ttl(block_key(writer.ns, 11)) == -1  # no TTL: the store's LRU bounds it
    reader = client(server.url)  # another engine: nothing pending, all from the store
    assert reader.contains([11, 12, 13]) == [True, True, False]
    got = reader.fetch([11, 12, 13])
    assert bytes(got[11]) == bytes(payload(1)) and bytes(got[12]) == bytes(payload(2)) and 13 not in got
    assert reader.stats.remote_bytes_read > 2 * NBYTES and reader.costs.loads_measured["remote"] == 1
    assert writer.stats.remote_bytes_written == 2 * NBYTES
    writer.close()
    reader.close()


@pytest.mark.parametrize("other", [{"dtype": "bfloat16"}, {"shape": [2, 2, 8, 1, 8]},
                                   {"fingerprint": "model-b"}])
def test_another_dtype_block_size_or_model_is_a_miss(server, other):
    writer = client(server.url)
    writer.put(21, payload(3))
    writer.flush(10)
    foreign = client(server.url, **other)
    assert foreign.contains([21]) == [False] and foreign.fetch([21]) == {}
    writer.close()
    foreign.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign", "garbage"])
def test_damaged_values_are_misses(server, damage):
    writer = client(server.url)
    writer.put(31, payload(4))
    writer.put(32, payload(5))
    writer.flush(10)
    redis = server.client()
    key = block_key(writer.ns, 31)
    value = bytearray(redis.get(key))
    if damage == "flip":
        value[-3] ^= 0x10
    elif damage == "truncate":
        value = value[:-16]
    elif damage == "foreign":  # another block's value under this key: its header names another hash
        value = bytearray(redis.get(block_key(writer.ns, 32)))
    else:
        value = bytearray(b"not a block")
    redis.set(key, bytes(value))
    reader = client(server.url)
    assert reader.contains([31]) == [True]  # there, but not usable
    assert reader.fetch([31, 32]).keys() == {32}
    assert reader.stats.remote_bad_values == 1
    writer.close()
    reader.close()


def test_refused_store_is_misses_one_log_line_and_errors(caplog):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    with caplog.at_level(logging.WARNING, logger="kvloop.kv.remote"):
        remote = client(url, timeout_s=0.2)
        assert wait_for(lambda: remote.stats.remote_errors >= 1)  # the writer's first ping
        for _ in range(3):
            assert remote.contains([1, 2]) == [False, False] and remote.fetch([1]) == {}
            assert not remote.put(1, payload(1))
    assert not remote.up and remote.stats.remote_connected == 0
    assert remote.stats.remote_writes_dropped == 3
    failures = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failures) == 1, "one line per state change, not per call"
    remote.close()


def test_silent_store_times_out():
    with socket.socket() as listener:  # accepts connections (the kernel's backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
        remote = client(url, timeout_s=0.05)
        assert wait_for(lambda: remote.stats.remote_errors >= 1)
        assert remote.contains([1]) == [False] and remote.stats.remote_connected == 0
        remote.close()


def test_store_back_is_up_again(tmp_path):
    server = RedisServer(tmp_path)
    remote = client(server.url, timeout_s=0.5)
    server.kill()
    assert remote.contains([1]) == [False] and not remote.up
    server.start()
    try:
        assert wait_for(lambda: remote.up)  # the writer's pings, backing off from 0.5 s
        assert remote.put(41, payload(6)) and remote.flush(10) and remote.contains([41]) == [True]
        assert remote.stats.remote_connected == 1
    finally:
        remote.close()
        server.kill()


def test_tls_store_with_a_password(tmp_path, monkeypatch):
    server = RedisServer(tmp_path, tls=True, password="s3cret")
    try:
        locked = client(server.url)
        assert locked.contains([1]) == [False] and locked.stats.remote_errors >= 1  # no password: refused
        locked.close()
        monkeypatch.setenv(PASSWORD_ENV, "s3cret")
        kv = KVConfig(kv_remote_url=server.url)
        mover = TierMover(torch.zeros([2, 2, 3, 4, 1, 8]), fingerprint="model-a")
        remote = mover.open_remote(kv, KVStats(), None)  # the engine's way: the password from the environment
        assert remote.put(51, payload(7)) and remote.flush(10) and remote.stats.remote_writes == 1
        assert remote.contains([51]) == [True] and remote.stats.remote_errors == 0
        remote.close()
    finally:
        server.kill()


def test_values_can_expire(server):
    writer = RemoteKV(open_store(server.url, 2.0, None, ttl_s=600), server.url, "model-a", "float32", SHAPE,
                      KVStats())
    writer.put(61, payload(8))
    writer.flush(10)
    assert 0 < server.client().ttl(block_key(writer.ns, 61)) <= 600
    writer.close()


@pytest.mark.parametrize("url, message", [
    ("redis://:secret@127.0.0.1:6379/0", "KVLOOP_KV_REMOTE_PASSWORD"),
    ("http://127.0.0.1:6379", "scheme"),
    ("redis:///0", "no host"),
])
def test_bad_urls_are_refused_clearly(url, message):
    with pytest.raises(ValueError, match=message):
        KVConfig(kv_remote_url=url)


def test_slow_link_recomputes():
    costs = TierCosts()
    costs.set_load_prior(737280)  # an fp32 SmolLM2 block: the prior says load
    costs.observe_compute(1000, 1.0)  # 1 ms a token: 16 ms a block
    assert costs.blocks_to_use(["remote"] * 4, 16) == 4
    for _ in range(40):  # a link measured at 50 ms a block
        costs.observe_load("remote", 1, 0.05)
    assert costs.blocks_to_use(["remote"] * 4, 16) == 0


def test_write_queue_is_bounded_in_bytes():
    with socket.socket() as listener:  # a store that never answers: the queued writes stay queued
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
        remote = RemoteKV(open_store(url, 2.0, None), url, "model-a", "float32", SHAPE, KVStats(),
                          queue_bytes=2 * NBYTES)
        assert [remote.put(h, payload(h)) for h in (1, 2, 3)] == [True, True, False]
        assert remote.stats.remote_writes_dropped == 1
        assert bytes(remote.fetch([2])[2]) == bytes(payload(2))  # queued writes are readable
        remote.close()
        assert remote.stats.remote_writes == 0 and remote.stats.remote_writes_dropped == 3


class DictStore:
    """A backend in a few lines (the interface a Mooncake-store or LMCache-server backend would implement)."""

    def __init__(self):
        self.values: dict[str, bytes] = {}

    def get_many(self, keys):
        return [self.values.get(k) for k in keys]

    def put_many(self, items):
        self.values.update(items)

    def contains_many(self, keys):
        return [k in self.values for k in keys]

    def ping(self):
        pass

    def close(self):
        pass


class CountingEvent:
    """Stands in for the CUDA event of a device copy that did not block the step."""

    def __init__(self):
        self.waits = 0

    def synchronize(self):
        self.waits += 1


def test_another_backend_and_a_copy_still_in_flight():
    store, event = DictStore(), CountingEvent()
    writer = RemoteKV(store, "redis://store:6379/0", "model-a", "float32", SHAPE, KVStats())
    assert writer.put(71, payload(9), event) and writer.flush(10)
    assert event.waits == 1  # the writer waited for the copy before reading the bytes
    reader = RemoteKV(store, "redis://store:6379/0", "model-a", "float32", SHAPE, KVStats())
    assert bytes(reader.fetch([71])[71]) == bytes(payload(9))
    writer.close()
    reader.close()
