"""The heat gate under pressure (DESIGN §2, issue 16): every full block is cached on the device at once;
blocks that have not earned their place are evicted first (two classes over GCLOCK, leaves first); the
copy to host is lazy (on eviction; every block while the host has room, under pressure blocks offered
once displace only each other and leave first); protected prefixes cool with protected
traffic only; the retention watermark keeps back earned blocks only; hits count once per request."""

from __future__ import annotations

from kv_helpers import ONE_TOKEN, fake_manager, serve

from kvloop.engine.core.sequence import Sequence
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.kv.eviction import LRU, GClock
from kvloop.engine.kv.host_tier import HostTier
from kvloop.engine.kv.manager import KVCacheManager
from kvloop.engine.kv.two_class import TwoClass

BS = 16
HOT = list(range(1000, 1000 + 8 * BS))
OTHER = list(range(3000, 3000 + 8 * BS))


def make(blocks: int = 32, **kw) -> KVCacheManager:
    kw.setdefault("host_cache_tokens", 0)
    kw.setdefault("watermark", 0.0)
    return fake_manager(blocks, BS, KVConfig(mode="codesign", **kw), "fp")


def one_off(i: int, n: int = 8 * BS) -> list[int]:
    return [50000 + i * 1000 + j for j in range(n)]


def make_hot(kv: KVCacheManager, prefix: list[int], tag: str) -> None:
    for i in range(3):  # three distinct requests: the prefix earns its place
        serve(kv, f"{tag}{i}", prefix + [7, i])


def test_two_class_order_evicts_probation_first_leaves_first_and_keeps_plain_orders_single_class():
    two = TwoClass(GClock(3))
    for slot in range(4):
        two.add(slot, earned=True)
    for slot in (4, 5):
        two.add(slot, earned=False)
    assert len(two) == 6 and two.num_earned == 4 and 5 in two
    assert two.victim(lambda s: s != 4) == 5  # probation first; 4 is not a leaf (has children)
    assert two.victim(lambda s: s != 4) == 0  # no evictable probation block left: the protected order's pick
    assert two.victim(lambda s: True) == 4
    two.add(1, earned=False)  # reclassified when it becomes evictable again
    assert two.num_earned == 2 and two.victim(lambda s: True) == 1
    lru = LRU()
    lru.add(0, earned=False)
    assert lru.num_earned == 1  # a single-class order ignores the class
    assert lru.victim_unearned(lambda s: True) == 0 and two.victim_unearned(lambda s: True) is None


def test_protected_blocks_cool_with_protected_traffic_only():
    two = TwoClass(GClock(3))
    for slot in range(4):
        two.add(slot)
    for _ in range(3):
        two.hit(2)  # three hits of credit
    two.cool(100)  # at most once round: everything without credit goes back to probation
    assert two.num_earned == 1 and two.cooled == 3 and two.is_earned(2)
    two.cool(2)  # at most once round again: one credit
    two.cool(1)  # slot 2 has spent its credit (one went in each round)
    assert two.is_earned(2)
    two.cool(1)
    assert two.num_earned == 0 and two.cooled == 4


def test_blocks_below_the_gate_are_cached_while_there_is_room():
    kv = make(admit_min_requests=3)
    serve(kv, "a", HOT + [1])
    assert kv.num_cached_blocks == 8 and kv.policy.num_earned == 0  # cached, on probation
    assert serve(kv, "b", HOT + [2]) == len(HOT)  # the second request hits on the device
    serve(kv, "c", HOT + [3])
    assert kv.policy.num_earned == 8 and kv.stats.evictions == kv.stats.admissions_refused == 0


def test_one_offs_cannot_cool_a_hot_prefix_but_other_protected_traffic_does():
    kv = make(blocks=40)
    make_hot(kv, HOT, "hot")
    for i in range(30):  # a flood of one-offs: probation churns, the hot prefix keeps its credit
        serve(kv, f"oneoff{i}", one_off(i))
    assert all(kv.policy.is_earned(kv.index.slot_of(h)) for h in kv.keys(Sequence("p", HOT + [1], ONE_TOKEN)))
    make_hot(kv, OTHER, "other")
    for i in range(6):  # another prefix keeps being used: HOT, unused meanwhile, cools
        serve(kv, f"other-again{i}", OTHER + [8, i])
    hot_blocks = [kv.index.slot_of(h) for h in kv.keys(Sequence("p", HOT + [1], ONE_TOKEN))]
    assert kv.policy.cooled >= 8 and not any(kv.policy.is_earned(b) for b in hot_blocks if b is not None)
    for i in range(3):  # pressure now takes the cooled prefix before the one in use
        serve(kv, f"late{i}", one_off(100 + i))
    assert serve(kv, "other-last", OTHER + [9]) == len(OTHER)


def test_the_host_copy_is_lazy_and_takes_every_block_while_the_host_has_room():
    kv = make(blocks=16, host_cache_tokens=64 * BS)
    serve(kv, "twice-a", HOT + [1])
    serve(kv, "twice-b", HOT + [2])  # offered twice
    assert kv.host.num_used == 0 and kv.stats.demotions_host == 0  # nothing copied while on the device
    serve(kv, "flood", one_off(1, 16 * BS))  # evicts HOT's blocks: the host has room, all go down
    assert kv.stats.evictions == kv.stats.demotions_host == kv.host.num_used == 8
    assert serve(kv, "again", HOT + [3]) == len(HOT) and kv.stats.hit_tokens_host == len(HOT)
    # again's blocks pushed the flood's (offered once) out of the device: into the host too, while it has room
    assert kv.stats.demotions_host == kv.stats.evictions > 8
    kv.mover.check([])


def test_under_host_pressure_blocks_offered_once_only_displace_each_other():
    kv = make(blocks=16, host_cache_tokens=12 * BS)  # a host of 12 slots
    serve(kv, "flood", one_off(1, 16 * BS))
    # 16 blocks offered once go down: 12 fit, the last 4 displace others
    serve(kv, "flood2", one_off(2, 16 * BS))
    assert kv.host.num_used == 12 and kv.host.policy.num_earned == 0 and kv.stats.demotions_host == 16
    serve(kv, "twice-a", HOT + [1])
    serve(kv, "twice-b", HOT + [2])
    # HOT (offered twice) goes down and pushes out 8 blocks offered once
    serve(kv, "flood3", one_off(3, 16 * BS))
    assert kv.host.num_used == 12 and kv.host.policy.num_earned == 8
    used = kv.stats.demotions_host
    serve(kv, "flood4", one_off(4, 16 * BS))  # 16 blocks offered once churn through the 4 slots of their kind
    assert kv.host.policy.num_earned == 8 and kv.stats.demotions_host == used + 16 and kv.host.num_used == 12
    # one-offs did not flush it
    assert serve(kv, "again", HOT + [3]) == len(HOT) and kv.stats.hit_tokens_host == len(HOT)
    kv.check_integrity([])


def test_a_host_full_of_earned_copies_refuses_blocks_offered_once_and_counts_them():
    kv = make(blocks=16, host_cache_tokens=8 * BS)  # a host of 8 slots
    serve(kv, "twice-a", HOT + [1])
    serve(kv, "twice-b", HOT + [2])
    serve(kv, "flood", one_off(1, 16 * BS))  # HOT (offered twice) goes down and fills the host
    assert kv.host.policy.num_earned == kv.host.num_used == kv.stats.demotions_host == 8
    assert kv.stats.host_copies_refused == 0
    # flood's 16 blocks (offered once) leave the device: no room for them
    serve(kv, "flood2", one_off(2, 16 * BS))
    assert kv.stats.host_copies_refused == 16 and kv.stats.demotions_host == 8
    assert kv.stats.evictions == kv.stats.demotions_host + kv.stats.host_copies_refused
    # HOT comes back whole: promoting its chain (each take evicts a flood2 block, refused by the host) does
    # not cool the chain's own later copies into probation, where those refused blocks could displace them
    assert serve(kv, "again", HOT + [3]) == len(HOT) and kv.stats.hit_tokens_host == len(HOT)
    kv.check_integrity([])


def test_host_tier_classes_follow_the_hash_as_of_now_and_unused_copies_cool():
    offers = {10: 1, 11: 1, 12: 2, 13: 2}
    host = HostTier(2, TwoClass(GClock(3)), lambda h: offers[h] >= 2)
    gone: list[int] = []

    def put(h: int) -> int | None:
        slot = host.acquire(lambda s, old: gone.append(old), earned=offers[h] >= 2)
        if slot is not None:
            host.insert(h, slot)
        return slot

    assert put(10) is not None and put(12) is not None  # free room takes anything
    assert put(11) is not None and gone == [10]  # offered once: displaces only its own kind
    offers[11] = 2
    host.hit(host.slot_of(11))  # used again: it has earned its place now
    assert host.policy.num_earned == 2
    # no room for a block offered once
    assert host.acquire(lambda s, old: gone.append(old), earned=False) is None
    assert put(13) is not None and len(gone) == 2  # an earned block may push out an earned one
    for _ in range(4):  # 11 keeps being used; 13, unused, spends its credit and cools back to probation
        host.hit(host.slot_of(11))
        host.cool(1)
    assert not host.policy.is_earned(host.slot_of(13)) and host.policy.is_earned(host.slot_of(11))
    assert put(10) is not None and gone[-1] == 13  # now a block offered once may take its place
    host.check([0, 0])
def test_the_watermark_keeps_back_earned_blocks_only_and_lets_go_when_they_cool():
    kv = make(blocks=32, watermark=0.5)
    make_hot(kv, HOT, "hot")  # 8 earned blocks
    serve(kv, "junk", one_off(1, 16 * BS))  # 16 blocks on probation
    holder = Sequence("holder", one_off(2, 4 * BS), ONE_TOKEN)
    assert kv.allocate(holder, 4 * BS)  # someone else holds blocks now: the watermark applies
    assert kv.num_allocatable_blocks == kv.pool.num_free + 16 == 20  # probation: all; earned: kept (8 < 16)
    big = Sequence("big", one_off(3, 21 * BS), ONE_TOKEN)
    assert not kv.allocate(big, 21 * BS) and kv.num_cached_blocks == 24
    kv.policy.cool(8)  # the protected traffic swept the hot prefix: it has cooled (GCLOCK credit spent)
    kv.policy.cool(8)
    kv.policy.cool(8)
    assert kv.policy.num_earned == 0 and kv.allocate(big, 21 * BS)  # cold: no longer kept back
    kv.release(big)
    kv.release(holder)
    kv.check_integrity([])


def test_a_request_looked_up_again_while_it_waits_counts_its_hit_once():
    kv = make()
    serve(kv, "doc", HOT + [1])
    seq = Sequence("waiting", HOT + [2], ONE_TOKEN)
    for _ in range(3):  # the head of the queue, looked up each step while memory is short
        assert kv.lookup_prefix(seq) == len(HOT)
        kv.release(seq)
        seq.num_computed_tokens = seq.num_cached_tokens = 0
        seq.cached_tokens_by_tier = {}
    st = kv.stats
    # doc's and waiting's
    assert st.hit_tokens_device == len(HOT) <= st.query_tokens_device == 2 * (len(HOT) + 1)
