"""Property-based tests: random sequences of admit (lookup + allocate), compute, append, release, swap
out/in, disk damage and watermark changes over the real KV manager and a content-tracking fake mover.
After every step: DESIGN §2's invariants, and every cached copy on every tier holds the right K/V.
Nothing leaks once all requests end."""

from __future__ import annotations

import itertools
import random
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kv_helpers import FakeMover, manager_state

from kvloop.engine.core.policy import cache_policy_names
from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.core.sequence import Sequence
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.kv.manager import KVCacheManager

BS = 4
PREFIXES = [list(range(1, 14)), list(range(1, 9)) + [50, 51, 52, 53, 54], [7] * 10, []]
PARAMS = SamplingParams(max_tokens=64, temperature=0)
STATS: Counter = Counter()  # what the long runs exercised (printed by the coverage test below)


class KVMachine(RuleBasedStateMachine):
    @initialize(mode=st.sampled_from(cache_policy_names()), pool=st.integers(5, 14),
                host=st.sampled_from([0, 3, 12]),
                disk=st.booleans(), admit=st.integers(1, 3), min_prefix=st.sampled_from([0, 8]),
                watermark=st.sampled_from([0.0, 0.25, 0.6]))
    def setup(self, mode, pool, host, disk, admit, min_prefix, watermark):
        cfg = KVConfig(mode=mode, admit_min_requests=admit, host_cache_tokens=host * BS,
                       disk_dir="unused-by-the-fake" if disk else None, disk_cache_tokens=6 * BS,
                       min_prefix_tokens=min_prefix, watermark=watermark, ghost_entries=32, regret_window=8)
        self.kv = KVCacheManager(pool, BS, cfg, extra_key="m")
        self.mover = FakeMover(self.kv, b"m")
        self.kv.attach_mover(self.mover)
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []
        self.ids = itertools.count()

    def live(self) -> list[Sequence]:
        return self.waiting + self.running + self.swapped

    @rule(prefix=st.sampled_from(range(len(PREFIXES))), tail=st.lists(st.integers(60, 63), max_size=16))
    def new_request(self, prefix, tail):
        ids = PREFIXES[prefix] + tail
        if ids:
            self.waiting.append(Sequence(f"r{next(self.ids)}", ids, PARAMS))

    @precondition(lambda self: self.waiting)
    @rule(pick=st.integers(0, 50), chunk=st.integers(4, 24))
    def admit(self, pick, chunk):
        seq = self.waiting.pop(pick % len(self.waiting))
        if seq.num_computed_tokens == 0 and not seq.block_table:
            before = manager_state(self.kv)
            match = self.kv.peek_prefix(seq)
            assert manager_state(self.kv) == before, "peek_prefix changed the manager"
            hit = self.kv.lookup_prefix(seq)
            assert hit < seq.num_tokens and hit % BS == 0
            assert seq.num_computed_tokens == seq.num_cached_tokens == hit
            self._check_peek(match, hit, seq.cached_tokens_by_tier)
        if not self._advance(seq, chunk):
            self.waiting.append(seq)  # waits (it may keep its prefix blocks, as the scheduler allows)
            return
        self.running.append(seq)

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 50), chunk=st.integers(1, 16), token=st.integers(60, 64), swap=st.booleans())
    def step(self, pick, chunk, token, swap):
        seq = self.running[pick % len(self.running)]
        if seq.num_uncomputed_tokens == 0:
            seq.token_ids.append(token)  # the sampled token, computed in the next step
        if self._advance(seq, chunk):
            return
        self.running.remove(seq)  # preempted: swap when there is room, else recompute later
        if swap and self.kv.swap_out(seq):
            assert not seq.block_table and self.kv.is_swapped(seq)
            self.swapped.append(seq)
            return
        self.kv.release(seq)
        seq.num_computed_tokens = seq.num_cached_tokens = 0
        self.waiting.append(seq)

    @staticmethod
    def _check_peek(match, hit: int, by_tier: dict[str, int]) -> None:
        """lookup_prefix attaches what peek_prefix saw, except where a promotion's own block take moved
        copies down the tiers (an evicted device block demoted, a host copy pushed to disk) or failed (no
        room, a bad disk file): then blocks come from lower tiers, or fewer are attached. A device-only
        match takes no block, so it is attached exactly."""
        assert hit <= match.tokens
        if not hit:
            return  # a miss leaves seq.cached_tokens_by_tier as it was
        assert sum(by_tier.values()) == hit
        if set(match.tiers) == {"device"}:
            assert by_tier == match.tokens_by_tier
        peeked = match.tokens_by_tier
        for top in (1, 2, 3):  # copies only move down: at each level, no more attached from above than seen
            upper = ("device", "host", "disk")[:top]
            assert sum(by_tier.get(t, 0) for t in upper) <= sum(peeked.get(t, 0) for t in upper)
        if by_tier == peeked:
            STATS.update(f"peek_agreed_{tier}" for tier in set(match.tiers))
        else:
            STATS["peek_moved_or_fell_short"] += 1

    def _advance(self, seq: Sequence, chunk: int) -> bool:
        n = min(chunk, seq.num_uncomputed_tokens)
        start = seq.num_computed_tokens
        if not self.kv.allocate(seq, start + n):
            return False
        self.mover.compute(seq, start, start + n)
        seq.num_computed_tokens = start + n
        return True

    @precondition(lambda self: self.swapped)
    @rule(pick=st.integers(0, 50))
    def swap_in(self, pick):
        seq = self.swapped[pick % len(self.swapped)]
        computed = seq.num_computed_tokens
        if self.kv.swap_in(seq):
            assert seq.num_computed_tokens == computed and len(seq.block_table) * BS >= computed
            self.swapped.remove(seq)
            self.running.append(seq)

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 50))
    def finish(self, pick):
        seq = self.running.pop(pick % len(self.running))
        self.kv.release(seq)

    @precondition(lambda self: self.live())
    @rule(pick=st.integers(0, 50))
    def abort(self, pick):
        live = self.live()
        seq = live[pick % len(live)]
        for group in (self.waiting, self.running, self.swapped):
            if seq in group:
                group.remove(seq)
        self.kv.release(seq)

    @rule(w=st.sampled_from([0.0, 0.1, 0.5, 0.9]))
    def set_watermark(self, w):
        self.kv.set_watermark(w)

    @precondition(lambda self: self.mover.disk)
    @rule(pick=st.integers(0, 50))
    def damage_disk_file(self, pick):
        files = sorted(self.mover.disk)
        self.mover.bad.add(files[pick % len(files)])

    @rule()
    def drop_next_disk_write(self):
        self.mover.drop_next_write = True

    @invariant()
    def consistent(self):
        if not hasattr(self, "kv"):
            return
        self.kv.check_integrity(self.live())
        self.mover.check(self.running)
        assert self.kv.num_free_blocks + self.kv.num_referenced_blocks == self.kv.num_blocks

    def teardown(self):
        if not hasattr(self, "kv"):
            return
        for seq in self.live():
            self.kv.release(seq)
        self.kv.check_integrity([])
        assert self.kv.num_referenced_blocks == 0
        assert self.kv.pool.num_free + self.kv.num_cached_blocks == self.kv.num_blocks
        if self.kv.host is not None:
            assert not any(self.kv.host.pins)
        self.mover.check([])


KVMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=50, deadline=None,
                                       suppress_health_check=[HealthCheck.too_slow])
TestKVMachine = KVMachine.TestCase


# derandomize: the same 100 seeds on every run, so the coverage check below cannot flake on an unlucky draw
@settings(max_examples=100, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1), mode=st.sampled_from(cache_policy_names()))
def test_long_random_runs(seed, mode):
    """Long seeded runs of the same rules (hypothesis' state machine prefers short programs): pressure
    builds up, so evictions, demotions, promotions, swaps and disk damage all happen."""
    rng = random.Random(seed)
    m = KVMachine()
    m.setup(mode=mode, pool=rng.randint(5, 16), host=rng.choice([0, 6, 12]), disk=rng.random() < 0.7,
            admit=rng.randint(1, 3), min_prefix=rng.choice([0, 8]), watermark=rng.choice([0.0, 0.25, 0.6]))
    for _ in range(300):
        op = rng.random()
        pick = rng.randrange(50)
        if op < 0.2:
            m.new_request(prefix=rng.randrange(len(PREFIXES)),
                          tail=[rng.randint(60, 63) for _ in range(rng.randrange(17))])
        elif op < 0.4 and m.waiting:
            m.admit(pick=pick, chunk=rng.randint(4, 24))
        elif op < 0.75 and m.running:
            m.step(pick=pick, chunk=rng.randint(1, 16), token=rng.randint(60, 64), swap=rng.random() < 0.7)
        elif op < 0.83 and m.swapped:
            m.swap_in(pick=pick)
        elif op < 0.92 and m.running:
            m.finish(pick=pick)
        elif op < 0.94 and m.live():
            m.abort(pick=pick)
        elif op < 0.96:
            m.set_watermark(w=rng.choice([0.0, 0.1, 0.5, 0.9]))
        elif op < 0.98 and m.mover.disk:
            m.damage_disk_file(pick=pick)
        else:
            m.drop_next_disk_write()
        m.consistent()
    m.teardown()
    STATS.update({k: v for k, v in m.kv.stats.as_dict().items() if v})


def test_long_runs_exercised_every_path():
    """Guards the fuzzing itself: the long runs above must have hit every tier and every movement."""
    if not STATS:
        test_long_random_runs()
    for key in ("hit_tokens_device", "hit_tokens_host", "hit_tokens_disk", "evictions", "host_evictions",
                "demotions_host", "demotions_disk", "promotions_host", "promotions_disk", "swaps_out",
                "swaps_in",
                "disk_bad_files", "disk_writes_dropped", "admissions_refused", "eviction_regret",
                "peek_agreed_device", "peek_agreed_host", "peek_agreed_disk"):
        assert STATS[key] > 0, f"the random runs never exercised {key}: {dict(STATS)}"
