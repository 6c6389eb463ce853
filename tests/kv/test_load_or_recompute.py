"""Load or recompute a lower-tier prefix (kv.load_or_recompute): the decision, its measured prices, the
KV manager asking it in lookup and peek alike, and the simulator's cost model giving it its prices."""

from __future__ import annotations

import pytest
import torch
from kv_helpers import ONE_TOKEN, fake_manager, manager_state, serve

from kvloop.engine.core.sequence import Sequence
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.kv.load_or_recompute import Prices, TierCosts, blocks_to_use
from kvloop.engine.kv.tier_mover import TierMover
from kvloop.engine.sim.profiles import get_profile

BS = 16
HOT = list(range(1000, 1000 + 8 * BS))


def test_device_blocks_are_always_used_and_unknown_recompute_cost_loads():
    assert blocks_to_use(["device"] * 3, BS, Prices({"host": 1.0}, token_s=1e-9)) == 3
    # token_s None
    assert blocks_to_use(["device", "host", "disk"], BS, Prices({"host": 1.0, "disk": 1.0})) == 3
    assert blocks_to_use([], BS, Prices(token_s=1.0)) == 0


def test_loads_only_where_cheaper_than_recomputing():
    cheap = Prices({"host": 1e-4, "disk": 1e-2}, token_s=1e-4)  # a block: 1.6 ms to recompute
    assert blocks_to_use(["device", "host", "host"], BS, cheap) == 3
    assert blocks_to_use(["device", "host", "disk", "disk"], BS, cheap) == 2  # disk: 10 ms > 1.6 ms
    tie = Prices({"host": BS * 1e-4}, token_s=1e-4)
    assert blocks_to_use(["host"] * 4, BS, tie) == 0  # a tie recomputes: no copy


def test_a_short_prefix_is_recomputed_and_a_long_one_loaded():
    # recomputing a token costs 10 us plus 20 ns per position it attends to; a disk block costs 1 ms to load
    prices = Prices({"disk": 1e-3}, token_s=1e-5, pair_s=2e-8)
    short, long = ["disk"] * 4, ["disk"] * 400
    assert blocks_to_use(short, BS, prices) == 0  # 64 tokens: far cheaper to recompute
    assert blocks_to_use(long, BS, prices) == 400  # 6,400 tokens: attention makes the late blocks dear


def test_tier_costs_measure_from_a_prior_and_a_model_fixes_them():
    costs = TierCosts(alpha=0.5)
    costs.set_load_prior(10_000_000)
    assert costs.load_block_s["host"] == pytest.approx(1e-3)
    assert costs.load_block_s["disk"] == pytest.approx(1e-2)
    costs.observe_load("host", 2, 4e-3)  # 2 ms a block
    assert costs.load_block_s["host"] == pytest.approx(1.5e-3)
    costs.set_load_prior(1)  # measured tiers keep their measurement
    assert costs.load_block_s["host"] == pytest.approx(1.5e-3)
    assert costs.blocks_to_use(["host"], BS) == 1  # recompute cost unknown: load
    costs.observe_compute(1000, 1.0)  # 1 ms a token: a block is 16 ms to recompute
    assert costs.token_s == pytest.approx(1e-3) and costs.blocks_to_use(["host"], BS) == 1
    costs.fix(Prices({"host": 1.0}, token_s=1e-3))
    costs.observe_load("host", 1, 1e-9)  # a model's prices ignore measurements
    assert costs.load_block_s["host"] == 1.0 and costs.blocks_to_use(["host"], BS) == 0


def test_the_tier_mover_times_its_loads():
    kv_cache = torch.zeros(2, 2, 4, 4, 1, 8)
    costs = TierCosts()
    mover = TierMover(kv_cache, host_slots=2, costs=costs)
    assert costs.load_block_s["host"] == pytest.approx(2 * 2 * 4 * 8 * 4 / 10e9)  # the prior from its bytes
    mover.device_to_host(0, 1)
    mover.host_to_device(1, 2)
    assert costs.loads_measured["host"] == 1


def spread_to_host(kv) -> None:
    """HOT offered twice, then evicted by a filler: its blocks are on the host only."""
    serve(kv, "a", HOT + [1])
    serve(kv, "b", HOT + [2])
    serve(kv, "filler", list(range(50000, 50000 + 16 * BS)))
    assert kv.host.num_used >= 8 and kv.index.slot_of(kv.keys(Sequence("x", HOT + [3], ONE_TOKEN))[0]) is None


@pytest.mark.parametrize("load_s, hit", [(1e-6, len(HOT)), (1.0, 0)])
def test_the_manager_loads_or_recomputes_by_price_in_lookup_and_peek_alike(load_s, hit):
    kv = fake_manager(16, BS, KVConfig(mode="codesign", host_cache_tokens=32 * BS, watermark=0.0), "fp")
    spread_to_host(kv)
    kv.tier_costs.fix(Prices({"host": load_s}, token_s=1e-4))
    seq = Sequence("again", HOT + [3], ONE_TOKEN)
    before = manager_state(kv)
    assert kv.peek_prefix(seq).tokens == hit
    assert manager_state(kv) == before
    assert kv.lookup_prefix(seq) == hit
    assert kv.stats.lower_tier_recomputed == (8 if hit == 0 else 0)
    assert kv.stats.hit_tokens_host == hit
    kv.release(seq)
    kv.check_integrity([])


@pytest.mark.parametrize("profile", ["cpu", "h200", "h200-70b-fp8"])
def test_the_simulator_prices_the_decision_from_its_cost_model(profile):
    prof = get_profile(profile)
    cost = prof.cost_model()
    prices = cost.tier_prices(prof.block_size)
    assert prices.load_block_s["host"] == pytest.approx(cost.transfer_seconds(1, 0, prof.block_size))
    assert prices.load_block_s["disk"] == pytest.approx(cost.transfer_seconds(0, 1, prof.block_size))
    assert prices.token_s > 0 and prices.pair_s > 0
    costs = TierCosts()
    costs.fix(prices)
    # a host load is cheaper than recomputing the block on every profile: host prefixes are loaded
    assert costs.blocks_to_use(["host"] * 8, prof.block_size) == 8
    tiers = ["disk"] * 125  # a 2,000-token document on disk: the same answer as the function's
    assert costs.blocks_to_use(tiers, prof.block_size) == blocks_to_use(tiers, prof.block_size, prices)


def test_an_8b_model_on_an_h200_recomputes_a_disk_prefix():
    """16 tokens of Llama-3-8B prefill in ~0.4 ms; their 2 MiB of K/V take ~0.42 ms from a 5 GB/s disk."""
    prof = get_profile("h200")
    prices = prof.cost_model().tier_prices(prof.block_size)
    assert blocks_to_use(["disk"] * 125, prof.block_size, prices) == 0
