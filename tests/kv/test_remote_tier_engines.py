"""Two engines (separate KV pools) over one real redis-server: a document prefilled on engine A is a remote
hit on engine B with exactly the greedy tokens of a cold run; with the store killed mid-run no request fails,
the hits fall back to recomputing, the error counter counts, no block leaks, and the tier comes back with the
store; a link measured slow is recomputed instead."""

from __future__ import annotations

import pytest
from kv_helpers import run, tokens
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from remote_redis import RedisServer, wait_for

from kvloop.engine.kv.tier_mover import TierMover
from kvloop.engine.server.metrics import EngineMetrics

DOC = tokens(7, 192)  # 12 blocks of a long shared document
QUESTIONS = [tokens(70 + i, 16) for i in range(3)]
N = 4
SMALL_POOL = 256  # 16 blocks: the filler evicts the document from B's device
FILLER = tokens(8, 250)


@pytest.fixture(scope="module")
def cold(make_engine):
    engine = make_engine(mode="continuous")
    outs = {}
    for i, q in enumerate(QUESTIONS):
        out, seq = run(engine, f"cold-{i}", DOC + q, N)
        assert seq.num_cached_tokens == 0
        outs[i] = out.token_ids
    return outs


def remote_engine(make_engine, url: str, **kv):
    """An engine with the remote tier (and neither host nor disk tier: the hits below can come from it
    alone); EngineCore wires the tier mover for a remote tier alone too."""
    engine = make_engine(kv_remote_url=url, kv_remote_timeout_ms=500, **kv)
    assert engine.kv.remote is not None
    assert isinstance(engine.kv.mover, TierMover)
    return engine


def scrape(engine) -> dict[tuple[str, str], float]:
    """Prometheus samples of the engine's snapshot: (sample name, direction or tier label) -> value."""
    text = generate_latest(EngineMetrics("m", engine.snapshot).registry).decode()
    return {(s.name, s.labels.get("direction", s.labels.get("tier", ""))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def no_failures(engine) -> bool:
    return engine.step_failures == 0 and not engine.request_failures


def all_free(engine) -> bool:
    return engine.kv.num_free_blocks == engine.kv.num_blocks


def test_document_prefilled_on_a_is_a_remote_hit_on_b(make_engine, cold, tmp_path):
    server = RedisServer(tmp_path)
    a = b = None
    try:
        a = remote_engine(make_engine, server.url)
        run(a, "prefill", DOC + QUESTIONS[0], N)
        a.kv.flush()  # the writes have landed
        assert a.kv.stats.remote_writes >= len(DOC) // 16
        b = remote_engine(make_engine, server.url)
        out, seq = run(b, "ask", DOC + QUESTIONS[1], N)
        assert seq.cached_tokens_by_tier == {"remote": len(DOC)} and out.num_cached_tokens == len(DOC)
        assert out.token_ids == cold[1]
        st = b.kv.stats
        assert st.promotions_remote == len(DOC) // 16 and st.hit_tokens_remote == len(DOC)
        assert st.query_tokens_remote > 0 and st.remote_bytes_read > 0 and st.remote_errors == 0
        assert b.kv.tier_costs.loads_measured["remote"] >= 1
        assert no_failures(b) and all_free(b)
        m = scrape(b)
        assert m["kvloop:kv_remote_up", ""] == 1 and m["kvloop:kv_remote_hits_total", ""] == len(DOC) // 16
        assert m["kvloop:prefix_cache_hits_total", "remote"] == len(DOC)
        assert m["kvloop:kv_remote_bytes_total", "read"] == st.remote_bytes_read
        assert scrape(a)["kvloop:kv_remote_writes_total", ""] == a.kv.stats.remote_writes
    finally:
        for engine in (a, b):
            if engine is not None:
                engine.kv.mover.close()
        server.kill()


def test_store_killed_mid_run(make_engine, cold, tmp_path, caplog):
    server = RedisServer(tmp_path)
    a = b = None
    try:
        a = remote_engine(make_engine, server.url)
        run(a, "prefill", DOC + QUESTIONS[0], N)
        a.kv.flush()
        b = remote_engine(make_engine, server.url, kv_cache_tokens=SMALL_POOL)
        out, seq = run(b, "hit", DOC + QUESTIONS[1], N)
        assert seq.cached_tokens_by_tier == {"remote": len(DOC)} and out.token_ids == cold[1]
        run(b, "filler", FILLER, N)  # the document leaves B's device; B still knows the store holds it
        assert b.kv.peek_prefix(DOC + QUESTIONS[2]).tiers[0] == "remote"

        server.kill()
        out, seq = run(b, "after-kill", DOC + QUESTIONS[2], N)  # the store is gone as B reads it
        assert seq.num_cached_tokens == 0 and out.token_ids == cold[2]  # recomputed, exactly
        assert b.kv.stats.remote_errors >= 1 and b.kv.stats.remote_connected == 0
        m = scrape(b)
        assert m["kvloop:kv_remote_up", ""] == 0 and m["kvloop:kv_remote_errors_total", ""] >= 1
        out, seq = run(b, "while-down", DOC + QUESTIONS[1], N)
        assert out.token_ids == cold[1]
        assert no_failures(b) and all_free(b)
        assert sum("failed" in r.getMessage() for r in caplog.records if r.name == "kvloop.kv.remote") == 1

        server.start()  # the same port: the writer's pings find it
        assert wait_for(lambda: b.kv.stats.remote_connected == 1)
        run(b, "filler-2", FILLER[::-1], N)
        b.kv.flush()
        assert b.kv.stats.remote_writes > 0
        assert no_failures(b) and all_free(b)
    finally:
        for engine in (a, b):
            if engine is not None:
                engine.kv.mover.close()
        server.kill()


def test_slow_link_recomputes_instead(make_engine, cold, tmp_path):
    server = RedisServer(tmp_path)
    a = b = None
    try:
        a = remote_engine(make_engine, server.url)
        run(a, "prefill", DOC + QUESTIONS[0], N)
        a.kv.flush()
        b = remote_engine(make_engine, server.url)
        costs = b.kv.tier_costs
        costs.observe_compute(1000, 0.001)  # recomputing a block: 16 µs
        for _ in range(60):
            costs.observe_load("remote", 1, 0.5)  # the link, as measured: half a second a block
        out, seq = run(b, "ask", DOC + QUESTIONS[1], N)
        assert seq.num_cached_tokens == 0 and out.token_ids == cold[1]
        assert b.kv.stats.lower_tier_recomputed >= len(DOC) // 16 and b.kv.stats.promotions_remote == 0
        assert all_free(b)
    finally:
        for engine in (a, b):
            if engine is not None:
                engine.kv.mover.close()
        server.kill()
