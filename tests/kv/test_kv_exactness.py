"""Reuse is exact: greedy fp32 outputs are token-identical whether the prefix was computed cold or came
from the device pool, the host tier or the disk tier (also after an engine restart), and damaged disk
files (flipped bit, truncated, another model's) are misses that change nothing but the hit length. Blocks
reach the lower tiers only when evicted from the device, so those cases put the pool under pressure."""

from __future__ import annotations

import pytest
from kv_helpers import run, tokens

from kvloop.engine.kv import disk_format as fmt
from kvloop.engine.kv.hashing import chain_hashes

DOC = tokens(1, 128)  # 8 blocks of a shared document
QUESTIONS = [tokens(10 + i, 16) for i in range(2)]
N = 4  # tokens generated per request
SMALL_POOL = 256  # 16 blocks: the filler below, with its output, needs all of them
FILLER = tokens(3, 250)  # pressure: evicts the document from the device (blocks go down the tiers only then)


@pytest.fixture(scope="module")
def cold(make_engine):
    engine = make_engine(mode="continuous")
    out, seq = run(engine, "cold", DOC + QUESTIONS[1], N)
    assert seq.num_cached_tokens == 0
    return out.token_ids


@pytest.mark.parametrize("tier, kv", [
    ("device", {"admit_min_requests": 1}),
    ("host", {"host_cache_tokens": 1024, "host_admit_min_requests": 1, "kv_cache_tokens": SMALL_POOL}),
])
def test_document_question_from_memory_tiers(make_engine, cold, tier, kv):
    engine = make_engine(**kv)
    run(engine, "warm", DOC + QUESTIONS[0], N)
    if tier != "device":
        run(engine, "filler", FILLER, N)
    out, seq = run(engine, "hit", DOC + QUESTIONS[1], N)
    assert seq.cached_tokens_by_tier == {tier: len(DOC)} and out.num_cached_tokens == len(DOC)
    assert out.token_ids == cold


def test_document_question_from_disk_and_after_restart_and_damage(make_engine, cold, tmp_path):
    kv = {"disk_dir": str(tmp_path), "disk_admit_min_requests": 1, "kv_cache_tokens": SMALL_POOL}
    engine = make_engine(**kv)
    run(engine, "warm", DOC + QUESTIONS[0], N)
    run(engine, "filler", FILLER, N)
    engine.kv.flush()
    out, seq = run(engine, "hit", DOC + QUESTIONS[1], N)
    assert seq.cached_tokens_by_tier == {"disk": len(DOC)} and out.token_ids == cold
    engine.kv.flush()

    restarted = make_engine(**kv)  # a new engine over the same directory finds the blocks
    assert len(restarted.kv.disk) >= len(DOC) // 16
    out, seq = run(restarted, "after-restart", DOC + QUESTIONS[1], N)
    assert seq.cached_tokens_by_tier == {"disk": len(DOC)} and out.token_ids == cold
    restarted.kv.flush()

    hashes = chain_hashes(DOC, 16, restarted.kv._extra)
    for block, how in ((6, "flip"), (5, "truncate"), (4, "foreign")):
        path = tmp_path / fmt.file_name(hashes[block])
        data = bytearray(path.read_bytes())
        if how == "flip":
            data[-5] ^= 0x01
        elif how == "truncate":
            data = data[:-64]
        else:
            data = data.replace(restarted.fingerprint.encode(), b"x" * len(restarted.fingerprint), 1)
        path.write_bytes(bytes(data))
        engine = make_engine(**kv)
        out, seq = run(engine, f"damaged-{how}", DOC + QUESTIONS[1], N)
        assert out.token_ids == cold, how
        assert seq.num_cached_tokens == block * 16, how  # a hit up to the damaged block
        assert engine.kv.stats.disk_bad_files == 1, how  # missed, deleted, counted
        engine.kv.flush()


def test_foreign_fingerprint_engine_never_sees_the_files(make_engine, tmp_path):
    kv = {"disk_dir": str(tmp_path), "disk_admit_min_requests": 1}
    first = make_engine(**kv)
    run(first, "warm", DOC + QUESTIONS[0], 1)
    first.kv.flush()
    other = make_engine(fingerprint="another-model", **kv)
    out, seq = run(other, "other", DOC + QUESTIONS[1], 1)
    assert seq.num_cached_tokens == 0  # the fingerprint is part of every block key


def test_multi_turn_chat_is_token_identical(make_engine):
    system, users = tokens(2, 64), [tokens(20 + i, 24) for i in range(3)]

    def chat(engine) -> list[list[int]]:
        history, replies = list(system), []
        for turn, user in enumerate(users):
            out, seq = run(engine, f"turn{turn}", history + user, 8)
            replies.append(out.token_ids)
            chat.cached.append(dict(seq.cached_tokens_by_tier))
            history = history + user + out.token_ids
        return replies

    chat.cached = []
    expected = chat(make_engine(mode="continuous"))
    chat.cached = []
    engine = make_engine(admit_min_requests=2, host_cache_tokens=1024)
    got = chat(engine)
    assert got == expected
    assert chat.cached[0] == {}
    assert set(chat.cached[1]) == set(chat.cached[2]) == {"device"}  # the pool has room: histories stay there
    snap = engine.snapshot()  # the counters the metrics and the control block read
    assert snap.prefix_hits("device") > 0 and snap.kv_stats.demotions_host == snap.kv_stats.evictions == 0
    assert snap.prefix_queries("device") == sum(64 + 24 * (t + 1) + 8 * t for t in range(3))
