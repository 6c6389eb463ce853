"""Copies down to the host are made where they pay (kv.copy_value): the share of evicted blocks of a class
asked for again, measured whether or not they were copied, against the prices of loading and recomputing."""

from __future__ import annotations

from kv_helpers import fake_manager, serve

from kvloop.engine.kv.config import KVConfig
from kvloop.engine.kv.copy_value import CopyValue
from kvloop.engine.kv.load_or_recompute import Prices

BS = 16
# a load costs 1, recomputing a block 3: a copy pays back where more than half of its class is asked again
BREAK_EVEN_HALF = Prices({"host": 1.0}, token_s=3.0 / BS)
CHEAP_LOADS = Prices({"host": 1.0}, token_s=100.0 / BS)  # pays back from 1 in 99


def test_share_counts_asks_per_class_once_per_eviction_and_decides_by_the_prices():
    cv = CopyValue(window=8, classes=3, min_evictions=2)
    assert cv.share(1) is None and cv.pays(1, BS, BREAK_EVEN_HALF)  # nothing measured: copy, as before
    for h in (1, 2, 3):
        cv.evicted(h, offers=1)
    cv.evicted(4, offers=7)  # counts at or above the top class share it
    cv.asked(1)
    cv.asked(1)  # once per eviction
    cv.asked(99)  # never evicted
    assert cv.share(1) == 1 / 3 and cv.share(2) is None and cv.share(9) is None  # class 2: too few evictions
    assert not cv.pays(1, BS, BREAK_EVEN_HALF) and cv.pays(1, BS, CHEAP_LOADS)
    assert cv.pays(1, BS, Prices({"host": 1.0}, token_s=None))  # recomputing has no price yet: copy
    # a load dearer than recomputing: never
    assert not cv.pays(1, BS, Prices({"host": 4.0}, token_s=3.0 / BS))


def test_asks_count_only_within_the_window_and_counts_halve_every_window():
    cv = CopyValue(window=2, classes=2, min_evictions=1)
    cv.evicted(1, offers=1)
    cv.evicted(2, offers=1)  # a window of evictions: the counts halve
    assert cv.evictions == [0.0, 1.0]
    cv.evicted(3, offers=1)  # 1 falls out of the window
    cv.asked(1)  # too late: a copy made then would be gone
    cv.asked(3)
    assert cv.evictions == [0.0, 2.0] and cv.asked_again == [0.0, 1.0] and cv.share(1) == 0.5


def manager(prices: Prices):
    kv = fake_manager(16, BS, KVConfig(mode="codesign", host_cache_tokens=256 * BS, watermark=0.0), "fp")
    kv.tier_costs.fix(prices)
    kv.copy_value.min_evictions = 17  # flood 0 (16 blocks) is copied whole
    return kv


def one_off(i: int) -> list[int]:
    return [50000 + i * 1000 + j for j in range(16 * BS)]


def test_one_off_blocks_stop_being_copied_and_copying_resumes_when_they_are_asked_for_again():
    kv = manager(BREAK_EVEN_HALF)
    for i in range(3):  # each flood of 16 blocks evicts the one before it; nobody asks for them again
        serve(kv, f"flood{i}", one_off(i))
    st = kv.stats
    # copied until 17 evictions are counted (none asked for again), then skipped
    assert st.evictions == 32 and st.demotions_host == 16 and st.host_copies_skipped == 16
    for i in range(3):  # the floods come back: 0 from its host copies, 1 and 2 recomputed; all count as asked
        serve(kv, f"again{i}", one_off(i)[: 15 * BS] + [1])
    assert st.hit_tokens_host == 15 * BS and kv.copy_value.share(1) > 0.5
    serve(kv, "flood3", one_off(3))
    copied = st.demotions_host
    serve(kv, "flood4", one_off(4))  # flood 3's blocks (used once, like the floods before) leave the device
    assert st.demotions_host == copied + 16  # copying them pays again
    kv.check_integrity([])
    kv.mover.check([])


def test_where_loads_are_cheap_every_evicted_block_is_still_copied():
    kv = manager(CHEAP_LOADS)
    serve(kv, "flood0", one_off(0))
    serve(kv, "flood1", one_off(1))
    serve(kv, "again", one_off(0)[:BS] + [1])  # one block used once asked for again: 1 in 16, above 1 in 99
    for i in range(2, 5):
        serve(kv, f"flood{i}", one_off(i))
    st = kv.stats
    assert kv.copy_value.share(1) < 0.02 and st.host_copies_skipped == 0 and st.demotions_host >= 64
