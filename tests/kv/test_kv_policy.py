"""Policy behaviour without a model: the admission gate against pollution, the watermark, the minimum
reusable prefix, GCLOCK versus LRU, the ghost table's bound, regret, swap, and the three modes."""

from __future__ import annotations

import pytest
from kv_helpers import ONE_TOKEN, fake_manager, serve

from kvloop.engine.core.sequence import Sequence
from kvloop.engine.kv.block_pool import BlockPool
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.kv.eviction import LRU, GClock
from kvloop.engine.kv.ghost import GhostTable
from kvloop.engine.kv.hashing import ROOT
from kvloop.engine.kv.manager import KVCacheManager
from kvloop.engine.kv.prefix_index import PrefixIndex
from kvloop.engine.kv.two_class import TwoClass

BS = 16
HOT = list(range(1000, 1000 + 8 * BS))  # a shared 128-token prefix (system prompt, document)


def make(mode: str = "codesign", blocks: int = 64, **kw) -> KVCacheManager:
    kw.setdefault("host_cache_tokens", 0)
    kw.setdefault("watermark", 0.0)
    return fake_manager(blocks, BS, KVConfig(mode=mode, **kw), "fp")


def one_off(i: int, n: int = 10 * BS) -> list[int]:
    return [50000 + i * 1000 + j for j in range(n)]


@pytest.mark.parametrize("mode, survives", [("codesign", True), ("continuous+lru", False)])
def test_gate_keeps_a_hot_prefix_through_a_flood_of_one_offs(mode, survives):
    kv = make(mode, blocks=32)
    for i in range(3):  # three distinct requests make the prefix hot
        serve(kv, f"hot{i}", HOT + [7, i, i, i])
    for i in range(40):  # 40 unique 160-token prompts: together far more than the 32-block pool
        serve(kv, f"oneoff{i}", one_off(i))
    hit = serve(kv, "hot-again", HOT + [9, 9, 9])
    assert (hit == len(HOT)) is survives
    if mode == "codesign":  # one-offs entered the cache, and only they were evicted (before earning a place)
        assert kv.stats.admissions_refused == kv.stats.evictions >= 40 * 10 - 32


def test_gate_thresholds_per_tier():
    kv = make(admit_min_requests=3, blocks=16, host_cache_tokens=32 * BS, host_admit_min_requests=2)
    serve(kv, "a", HOT + [1])
    assert kv.num_cached_blocks == 8 and kv.host.num_used == 0  # cached on the device at once; no copy yet
    assert serve(kv, "b", HOT + [2]) == len(HOT) and kv.stats.hit_tokens_device == len(HOT)
    assert kv.policy.num_earned == 0  # two requests: still on probation
    serve(kv, "x", one_off(1, 16 * BS))  # pressure: evicted, and copied down (offered twice)
    assert kv.stats.evictions == kv.stats.admissions_refused == 8 and kv.host.num_used == 8
    assert serve(kv, "c", HOT + [3]) == len(HOT) and kv.stats.hit_tokens_host == len(HOT)
    assert kv.policy.num_earned == 8  # three distinct requests: protected on the device
    assert serve(kv, "d", HOT + [4]) == len(HOT) and kv.stats.hit_tokens_device == 2 * len(HOT)


def test_same_request_counts_once():
    kv = make(admit_min_requests=2)
    seq = Sequence("same", HOT + [1], ONE_TOKEN)
    for _ in range(3):
        assert kv.lookup_prefix(seq) == 0
    assert len(kv.ghost) == 8 and all(kv.ghost.count(h) == 1 for h in kv.ghost._seen)


def test_without_lower_tiers_evicted_blocks_are_dropped():
    kv = make(admit_min_requests=3, blocks=16)
    serve(kv, "a", HOT + [1])
    assert kv.num_cached_blocks == 8  # below the gate, but there is room: cached
    serve(kv, "x", one_off(1, 16 * BS))
    assert kv.stats.evictions == 8 and kv.stats.demotions_host == 0


def test_min_prefix_tokens_short_matches_are_misses():
    kv = make(admit_min_requests=1, min_prefix_tokens=64)
    serve(kv, "a", HOT[:48] + [1])  # 3 full blocks = 48 tokens cached
    seq = Sequence("b", HOT[:48] + [2, 3], ONE_TOKEN)
    assert kv.lookup_prefix(seq) == 0 and not seq.block_table  # 48 < 64: no pinning, no promotion
    assert kv.stats.short_prefix_misses == 1
    assert serve(kv, "c", HOT[:80] + [1]) == 0  # computes 5 blocks; blocks 0-2 dedupe onto the cached ones
    assert serve(kv, "d", HOT[:80] + [2]) == 80


def test_hit_never_covers_the_last_token():
    kv = make(admit_min_requests=1, min_prefix_tokens=0)
    serve(kv, "a", HOT)
    seq = Sequence("b", list(HOT), ONE_TOKEN)
    assert kv.lookup_prefix(seq) == len(HOT) - BS  # the last block is computed again, so a token is sampled


def test_watermark_keeps_cached_blocks_back_and_is_live():
    kv = make(admit_min_requests=1, blocks=32, watermark=0.5)
    serve(kv, "hot", HOT * 2)  # 16 cached blocks = 50% of the pool
    holder = Sequence("holder", one_off(1, 4 * BS), ONE_TOKEN)
    assert kv.allocate(holder, 4 * BS)  # someone else holds blocks now
    big = Sequence("big", one_off(2, 20 * BS), ONE_TOKEN)
    assert kv.num_allocatable_blocks == 12
    assert not kv.allocate(big, 20 * BS)  # would need to evict below the watermark
    assert kv.num_cached_blocks == 16
    kv.set_watermark(0.25)  # the coordinator lowers it: 8 cached blocks may go now
    assert kv.allocate(big, 20 * BS)
    assert kv.num_cached_blocks == 8 and kv.stats.evictions == 8
    with pytest.raises(ValueError):
        kv.set_watermark(1.0)
    kv.release(big)
    kv.release(holder)
    kv.check_integrity([])


def test_watermark_never_blocks_a_lone_sequence():
    kv = make(admit_min_requests=1, blocks=32, watermark=0.9)
    serve(kv, "hot", HOT * 3)  # 24 cached
    assert serve(kv, "alone", one_off(3, 30 * BS)) == 0  # nobody else holds blocks: evicts what it needs


def test_eviction_is_leaves_first_and_counts_regret():
    kv = make("continuous+lru", blocks=12)
    serve(kv, "doc", HOT)  # 8 cached blocks in a chain
    serve(kv, "x", one_off(1, 8 * BS))  # needs 8, only 4 free: evicts the doc's last 4 blocks
    kv.check_integrity([])  # includes: the index is prefix-closed (no orphans)
    assert serve(kv, "doc-again", HOT + [5]) == 4 * BS  # the first half survived, no orphans
    assert kv.stats.eviction_regret == 4


def test_gclock_prefers_frequently_hit_blocks():
    g = GClock(max_count=3)
    for s in range(4):
        g.add(s)
    for _ in range(3):
        g.hit(2)
    order = [g.victim(lambda s: True) for _ in range(4)]
    assert order[-1] == 2 and sorted(order) == [0, 1, 2, 3]
    lru = LRU()
    for s in (0, 1, 2):
        lru.add(s)
    assert lru.victim(lambda s: s != 0) == 1


def test_bulk_forms_match_one_at_a_time():
    """The release path's bulk calls (hit_all, add_all, decref_all, counts, hashes_of) leave what the single
    calls leave, in the same order: a bulk form that reorders or drops an entry fails."""
    def orders(make_order):
        one, bulk = make_order(), make_order()
        slots, earned = [5, 3, 9, 3, 1, 7], [True, False, True, True, False, False]
        for slot, e in zip(slots, earned, strict=True):
            one.add(slot, e)
            one.hit(slot)
            one.hit(slot)
        bulk.add_all(slots, earned)
        bulk.hit_all(slots + slots)
        return one, bulk
    for make_order in (LRU, lambda: GClock(max_count=2), lambda: TwoClass(GClock(max_count=2))):
        one, bulk = orders(make_order)
        assert list(one) == list(bulk)
        counts = getattr(getattr(bulk, "order", bulk), "counts", None)
        assert counts in (None, dict.fromkeys([5, 3, 9, 1, 7], 2))  # hit 2 or 4 times each: capped at 2
        assert counts == getattr(getattr(one, "order", one), "counts", None)
        assert [one.victim(lambda s: True) for _ in range(5)] == [bulk.victim(lambda s: True)
                                                                  for _ in range(5)]
    pool = BlockPool(4)
    taken = [pool.allocate() for _ in range(3)]
    assert pool.incref_all([taken[1]]) == []  # referenced already
    assert pool.decref_all([taken[2], taken[1], taken[0]]) == [taken[2], taken[0]]
    # the second reference is not a first
    assert pool.incref_all([taken[2], taken[2], taken[1]]) == [taken[2]]
    assert [pool.ref_counts[b] for b in taken] == [0, 2, 2]
    with pytest.raises(RuntimeError, match="released more often"):
        pool.decref_all([taken[0]])
    ghost = GhostTable(capacity=8, max_count=3)
    ghost.record_all([1, 2], "a")
    ghost.record_all([2], "b")
    assert ghost.counts([2, 1, 4]) == [ghost.count(2), ghost.count(1), ghost.count(4)] == [2, 1, 0]
    index = PrefixIndex()
    index.add(3, 30, ROOT)
    index.add(1, 10, 30)
    assert index.hashes_of([1, 2, 3]) == [index.hash_of(1), index.hash_of(2), index.hash_of(3)] == [10, None,
                                                                                                    30]


def test_ghost_table_is_bounded():
    ghost = GhostTable(capacity=100, max_count=3)
    for h in range(1000):
        for r in range(5):
            ghost.record(h, f"r{r}")
    assert len(ghost) == 100 and ghost.count(999) == 3 and ghost.count(0) == 0


def test_ghost_record_all_counts_distinct_requests_and_drops_least_recently_touched():
    ghost = GhostTable(capacity=4, max_count=2)
    ghost.record_all(range(6), "r1")  # 0 and 1 fall out
    ghost.record_all([2, 2, 3], "r2")  # a request counts once per hash
    ghost.record_all([2], "r3")  # saturated at max_count
    assert [ghost.count(h) for h in range(6)] == [0, 0, 2, 2, 1, 1]
    ghost.record(9, "r1")  # 4 is the least recently touched
    assert ghost.count(4) == 0 and ghost.count(5) == 1 and ghost.count(9) == 1 and len(ghost) == 4


def test_swap_out_and_in_keep_progress_and_reuse_cached_copies():
    kv = make(admit_min_requests=1, blocks=16, host_cache_tokens=16 * BS)
    seq = Sequence("s", HOT + [1, 2, 3], ONE_TOKEN)
    assert kv.allocate(seq, len(seq.token_ids))
    kv.mover.compute(seq, 0, len(seq.token_ids))
    seq.num_computed_tokens = len(seq.token_ids)
    assert kv.swap_out(seq) and kv.is_swapped(seq) and not seq.block_table
    assert kv.num_cached_blocks == 8  # the full blocks stay cached on the device (admit 1)
    assert kv.lookup_prefix(seq) == 0  # a swapped sequence is not looked up again
    assert kv.allocate(seq, len(seq.token_ids) + 1)  # allocate swaps in first
    assert not kv.is_swapped(seq) and seq.num_computed_tokens == len(HOT) + 3
    kv.mover.check([seq])
    assert kv.stats.swaps_out == kv.stats.swaps_in == 1
    kv.release(seq)
    kv.check_integrity([])
    assert not make("codesign").swap_out(seq)  # no host tier: the caller recomputes


def test_modes():
    cont = make("continuous")
    serve(cont, "a", HOT + [1])
    assert serve(cont, "b", HOT + [2]) == 0 and cont.num_cached_blocks == 0
    lru = make("continuous+lru", watermark=0.5)
    serve(lru, "a", HOT + [1])
    assert serve(lru, "b", HOT + [2]) == len(HOT)  # no gate: cached after one request
    assert lru.num_allocatable_blocks == lru.num_free_blocks  # no watermark in this mode
    with pytest.raises(ValueError):
        KVConfig(mode="static-ish")
