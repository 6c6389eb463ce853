"""Per-sequence block tables over the device pool, with the shared prefix cache and its tiers (pure Python).

The scheduler talks to the KV cache only through this class:
- `lookup_prefix(seq)`: at admission, attaches the longest cached prefix of seq's tokens (device blocks
  shared, host/disk blocks promoted by copying where that is cheaper than recomputing them:
  kv.load_or_recompute), never the last token; a match shorter than `min_prefix_tokens` is a miss. Sets
  seq.num_computed_tokens, num_cached_tokens, cached_tokens_by_tier.
- `peek_prefix(seq or token ids)`: the same match by tier, changing nothing (the scheduler's prefix view).
- `allocate(seq, total_tokens) -> bool`: all or nothing; may evict cached blocks, but only down to the
  retention watermark (unless no other sequence holds blocks, so the engine always makes progress).
  A swapped-out sequence is swapped in first.
- `release(seq)`: full blocks are indexed by chained hash and stay cached on the device (evictable). Where
  the cache policy is heat-gated, blocks whose hash fewer than `admit_min_requests` distinct requests used
  (the ghost table) are on probation and evicted before those that earned their place (kv.two_class). A
  block evicted from the device is copied to the lower tiers whose thresholds its hash passes (lazily: only
  then), or dropped; to the host only where such copies pay: blocks of its class are asked for again often
  enough that loading them saves more than copying costs (kv.copy_value).
- `swap_out(seq) -> bool` / `swap_in(seq) -> bool` (for preemption): swap_out copies seq's blocks to the
  host tier (pinned there), frees its device blocks and keeps num_computed_tokens; False (nothing
  changed) when there is no host tier or no room, in which case the caller recomputes instead.
  swap_in brings them back (reusing device copies that are still cached); False when the device pool
  has no room. `is_swapped(seq)` tells; release(seq) of a swapped sequence frees its host slots.
- `persist(deadline)` (shutdown): writes the device and host tiers' cached blocks to the disk tier in
  prefix order, waiting for the writes, bounded by the deadline (kv.persist).
- `knobs.watermark` (core/knobs.py): the live retention knob (codesign mode only; other modes keep nothing
  back): the share of the pool that cached blocks which earned their place keep against allocations. The
  scheduler shares its Knobs with the manager; a manager alone starts from its config's watermark.
- `tier_costs` (kv.load_or_recompute.TierCosts): the prices of loading a block per lower tier and of
  recomputing a token; the tier mover reports its copies, `observe_compute` takes the engine's prefill
  throughput, `fix` takes a cost model's prices (the simulator).
- Counts: num_blocks, num_free_blocks (not referenced: free + cached, as vLLM counts them),
  num_cached_blocks, num_allocatable_blocks, usage() (referenced share), stats (queries and hits per tier
  as core/kv_stats.py defines them; the engine snapshot reads them all).
- `check_integrity(live)`: the invariants of DESIGN §2, for tests.

Tensors move only through `self.mover` (kv.tier_mover.TierMover in the engine; NullMover otherwise)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection, Iterable
from itertools import filterfalse, takewhile

from kvloop.engine.core.knobs import BATCH_CAP, STEP_TOKEN_BUDGET, Knobs
from kvloop.engine.core.kv_stats import KVStats, RegretWindow
from kvloop.engine.core.sequence import Sequence
from kvloop.engine.kv.block_pool import BlockPool
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.kv.copy_value import CopyValue
from kvloop.engine.kv.disk_tier import DiskTier
from kvloop.engine.kv.event_log import KVEventLog, TokenRecordingHasher
from kvloop.engine.kv.eviction import make_policy
from kvloop.engine.kv.ghost import GhostTable
from kvloop.engine.kv.hashing import ROOT, BlockKeys, ChainHasher
from kvloop.engine.kv.host_tier import HostTier
from kvloop.engine.kv.integrity import check_manager
from kvloop.engine.kv.load_or_recompute import TierCosts
from kvloop.engine.kv.mover_api import Mover, NullMover
from kvloop.engine.kv.persist import PersistMixin
from kvloop.engine.kv.prefix_index import PrefixIndex
from kvloop.engine.kv.prefix_match import PrefixMatch
from kvloop.engine.kv.remote_mixin import RemoteMixin, make_remote_index
from kvloop.engine.kv.swap import SwapMixin
from kvloop.engine.kv.two_class import TwoClass


def blocks_for(num_tokens: int, block_size: int) -> int:
    return (num_tokens + block_size - 1) // block_size


class KVCacheManager(SwapMixin, PersistMixin, RemoteMixin):
    def __init__(self, num_blocks: int, block_size: int, config: KVConfig | None = None, extra_key: str = "",
                 block_keys: Callable[[int, bytes], BlockKeys] = ChainHasher):
        # A bare manager is the plain allocator (mode continuous); the engine passes its configured mode.
        cfg = self.config = config or KVConfig(mode="continuous")
        # read once: the manager's structure (its classes and tiers) follows the policy it was built with
        self.cache_policy = cfg.cache_policy
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.index = PrefixIndex()
        order = make_policy(cfg.eviction, cfg.gclock_max)
        # heat-gated: blocks that have not earned their place leave first (plain orders keep one class)
        self.policy = TwoClass(order) if self.cache_policy.heat_gated else order
        self.ghost = GhostTable(cfg.ghost_entries, max(cfg.admit_min_requests, cfg.host_admit_min_requests,
                                                       cfg.disk_admit_min_requests))
        host_slots = cfg.host_cache_tokens // block_size
        # The host tier exists in every mode for swapping; only codesign also caches into it, with the heat
        # gate's two classes there too (host_tier.py)
        host_order = make_policy(cfg.eviction, cfg.gclock_max)
        gated = self.cache_policy.heat_gated
        self.host = HostTier(host_slots, TwoClass(host_order) if gated else host_order,
                             self._host_earned) if host_slots else None
        # copies down to the host are made where they pay (copy_value.py); the class
        # is the ghost count, capped
        caching_host = self.host is not None and self.cache_policy.lower_tiers
        self.copy_value = CopyValue(host_slots, self.ghost.max_count + 1) if caching_host else None
        disk_slots = cfg.disk_cache_tokens // block_size
        with_disk = self.cache_policy.lower_tiers and cfg.disk_dir and disk_slots
        self.disk = DiskTier(disk_slots) if with_disk else None
        # the remote tier below the disk, shared with other engines (kv.remote_mixin); None: not configured
        self.remote = make_remote_index(cfg, self.cache_policy.lower_tiers)
        self.stats = KVStats()
        self.regret = RegretWindow(cfg.regret_window)
        self.mover: Mover = NullMover()
        self.tier_costs = TierCosts()
        self._extra = extra_key.encode()
        # block keys (hashing.py): ChainHasher hashes each distinct block once; the
        # simulator passes a cheaper one
        self._hasher = block_keys(block_size, self._extra)
        self._keys: weakref.WeakKeyDictionary[Sequence, list[int]] = weakref.WeakKeyDictionary()
        # a manager alone reads only the watermark: the widest cap and budget stand for "no scheduler"
        self.knobs = Knobs(BATCH_CAP.hi, cfg.watermark, STEP_TOKEN_BUDGET.hi, block_size)
        self._swapped: dict[int, tuple[Sequence, list[int]]] = {}
        self._last_query: str | None = None
        self._last_served: dict[str, int] = {}  # hit tokens by tier counted for the last looked-up request
        # disk writes of one allocation, see _take_blocks
        self._disk_batch: list[tuple[int, int]] | None = None
        # KV events for routers: published from a thread of their own where the config names an endpoint
        self.events_publisher = None
        if cfg.kv_events_endpoint:
            from kvloop.engine.kv.events_publisher import KVEventPublisher  # zmq only where events are on

            self.events_publisher = KVEventPublisher.attach(self, cfg.kv_events_endpoint, cfg.kv_events_topic,
                                                            cfg.kv_events_replay_endpoint,
                                                            hash_kind=cfg.kv_events_hash,
                                                            hash_seed=cfg.kv_events_hash_seed,
                                                            encoding=cfg.kv_events_encoding)

    def attach_mover(self, mover: Mover) -> None:
        """Wires the tensor mover; the disk index is rebuilt from what the directory holds."""
        self.mover = mover
        if self.disk is not None:
            for h in mover.disk_scan():
                for victim in self.disk.add(h):
                    mover.disk_delete(victim)

    def attach_events(self, log: KVEventLog) -> None:
        """Reports the device prefix index's stores and drops to `log` (KV events for routers). Called before
        the first request: the block keys are re-hashed by a ChainHasher that also remembers each key's
        token ids, which stored events carry (kv/event_log.py)."""
        assert not self.index.slots, "attach_events before any block is indexed"
        hasher = TokenRecordingHasher(self.block_size, self._extra)
        self._hasher = hasher
        log.hasher = hasher
        log.stats = self.stats
        self.index.events = log

    def reset_prefix_cache(self) -> bool:
        """Forgets every block cached on the device (vLLM's reset_prefix_cache); False, changing nothing,
        while any sequence holds blocks. Reported as one all-cleared event."""
        if self.num_referenced_blocks or self._swapped:
            return False
        for slot in self.index.clear():
            self.policy.forget(slot)
            self.pool.put_free(slot)
        return True

    # ---- counts ---------------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self.policy)

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds: free plus cached (evictable) ones."""
        return self.pool.num_free + len(self.policy)

    @property
    def num_referenced_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_allocatable_blocks(self) -> int:
        """Blocks an allocation can get now while other sequences hold blocks (the watermark applies)."""
        return self.pool.num_free + self._evictable_budget(len(self.policy), self.num_referenced_blocks, 0)

    def usage(self) -> float:
        """Share of the device pool held by running sequences."""
        return self.num_referenced_blocks / self.num_blocks

    @property
    def watermark(self) -> float:
        return self.knobs.watermark

    def set_watermark(self, w: float) -> None:
        self.knobs.set(watermark=w)

    def _evictable_budget(self, cached: int, referenced: int, own: int) -> int:
        """Cached blocks an allocation may evict; `own` = blocks the allocating sequence already holds. The
        watermark keeps back cached blocks that earned their place (up to its share of the pool); blocks on
        probation are always evictable, and a protected block that cools goes back to probation."""
        if not self.cache_policy.retention_watermark or referenced <= own:
            return cached  # no watermark, or nobody else holds blocks: keeping any back would stall
        kept = min(int(self.knobs.watermark * self.num_blocks), self.policy.num_earned)
        return max(0, cached - kept)

    def _holder_budget(self, seq: Sequence) -> int:
        table, referenced = seq.block_table, self.num_referenced_blocks
        # own blocks matter only when they could be all the referenced ones: a longer count than the table's
        # settles that without counting distinct blocks (one per eviction, near a full pool)
        own = len(set(table)) if referenced <= len(table) else len(table)
        return self._evictable_budget(len(self.policy), referenced, own)

    # ---- lookup ---------------------------------------------------------------------------------
    def keys(self, seq: Sequence) -> list[int]:
        """Chained keys of seq's full blocks so far. Each block is hashed once: token_ids only grow,
        and lookup, commit and the scheduler's prefix view all read the same list."""
        memo = self._keys.get(seq)
        if memo is None:
            memo = self._keys[seq] = []
        done = len(memo)
        if done < len(seq.token_ids) // self.block_size:
            memo += self._hasher(seq.token_ids, parent=memo[-1] if done else ROOT, start=done)
        return memo

    def lookup_prefix(self, seq: Sequence) -> int:
        """Attaches cached blocks of seq's prefix; returns how many tokens they cover (0 on a miss)."""
        # a head of queue waiting for memory is looked up every step
        first = seq.request_id != self._last_query
        self._last_query = seq.request_id
        skipped = self._lookup_skipped(seq)
        hit = 0 if skipped else self._attach_prefix(seq)
        served = dict(seq.cached_tokens_by_tier) if hit else {}
        if first:  # the queries per tier, as kv.stats defines them
            self.stats.count_lookup(len(seq.token_ids), served,
                                    ("device",) if skipped else self._lookup_tiers())
        # a request's hit is its last lookup's (a head of queue is looked up again while it waits)
        self.stats.count_hits(served, {} if first else self._last_served)
        self._last_served = served
        return hit

    def _lookup_tiers(self) -> tuple[str, ...]:
        """The tiers a prefix lookup asks, top down (as _tier_of reads them)."""
        host = self.cache_policy.lower_tiers and self.host is not None
        return ("device",) + (("host",) if host else ()) + (("disk",) if self.disk is not None else ()) + (
            ("remote",) if self.remote is not None else ())

    def _attach_prefix(self, seq: Sequence) -> int:
        tokens = seq.token_ids
        bs = self.block_size
        hashes = self.keys(seq)
        if self.cache_policy.heat_gated:
            self.ghost.record_all(hashes, seq.request_id)
        self._remote_probe(hashes, len(tokens))  # one round trip to the store, where it is configured
        matched = self._matched_tiers(hashes, len(tokens))
        found = self._worth_using(matched)
        self.stats.lower_tier_recomputed += len(matched) - found
        for h in filterfalse(self.index.slots.__contains__, hashes):  # not on the device
            if self.regret.asked(h):
                self.stats.eviction_regret += 1
            if self.copy_value is not None:
                self.copy_value.asked(h)
        min_tokens = self.min_reusable_tokens
        if found == 0 or found * bs < min_tokens:
            self.stats.short_prefix_misses += found > 0
            return 0
        # the leading run held on the device is shared in one pass (most of a hit); the rest block by block
        shared = len(list(takewhile("device".__eq__, matched[:found])))
        if shared:
            self._share_indexed(seq, hashes[:shared])
        by_tier: dict[str, int] = {"device": shared * bs} if shared else {}
        from_disk: list[int] = []
        parent = hashes[shared - 1] if shared else ROOT
        self._remote_prefetch(hashes[shared:found], matched[shared:found])
        for h in hashes[shared:found]:
            tier = self._attach(seq, h, parent)
            if tier is None:
                break
            by_tier[tier] = by_tier.get(tier, 0) + bs
            if tier == "disk":
                from_disk.append(h)
            seq.block_hashes.append(h)
            parent = h
        self._remote_done()
        if from_disk:
            self.disk.touch_chain(from_disk)
        if by_tier.get("host"):
            self.host.cool(by_tier["host"] // bs)
        hit = len(seq.block_table) * bs
        if hit < min_tokens:  # promotion fell short (no room, bad disk file): give the blocks back
            self._unref_all(seq.block_table)
            seq.block_table, seq.block_hashes = [], []
            self.stats.short_prefix_misses += 1
            return 0
        seq.num_computed_tokens = seq.num_cached_tokens = hit
        seq.cached_tokens_by_tier = by_tier
        return hit

    def peek_prefix(self, seq: Sequence | Iterable[int]) -> PrefixMatch:
        """The prefix lookup_prefix(seq) would attach now, by tier, under its rules (never the last token,
        the minimum reusable prefix, the tiers the cache policy reads), changing nothing: no stats, ghost
        counts, eviction clocks or disk recency. Token ids are matched as a new sequence's would be.
        Promoting can change what lookup then finds: a block taken for a promotion may evict and demote
        a matched block or push a host copy to disk (found one tier lower), or find no room or a bad disk
        file (fewer blocks attached). A match on the device alone is attached exactly."""
        if isinstance(seq, Sequence):
            if self._lookup_skipped(seq):
                return PrefixMatch()
            hashes, num_tokens = self.keys(seq), len(seq.token_ids)
        else:
            tokens = list(seq)
            num_tokens = len(tokens)
            usable = max(0, num_tokens - 1) // self.block_size
            cached = self.cache_policy.prefix_cache
            hashes = self._hasher(tokens, usable) if cached else []
        tiers = self._leading_tiers(hashes, num_tokens)
        if not tiers or len(tiers) * self.block_size < self.min_reusable_tokens:
            return PrefixMatch()
        return PrefixMatch(tuple(hashes[: len(tiers)]), tuple(tiers), self.block_size)

    @property
    def min_reusable_tokens(self) -> int:
        """The shortest match that is a hit: min_prefix_tokens where the cache policy keeps a minimum, else
        any full block."""
        return self.config.min_prefix_tokens if self.cache_policy.min_prefix else 1

    def _lookup_skipped(self, seq: Sequence) -> bool:
        """No prefix lookup: no prefix cache, or seq holds blocks already (running, or swapped out)."""
        return not self.cache_policy.prefix_cache or bool(seq.block_table) or self.is_swapped(seq)

    def _leading_tiers(self, hashes: list[int], num_tokens: int) -> list[str]:
        """Tiers of the leading blocks a lookup would attach: those the cache holds, as far as attaching them
        is cheaper than recomputing them."""
        tiers = self._matched_tiers(hashes, num_tokens)
        return tiers[: self._worth_using(tiers)]

    def _worth_using(self, tiers: list[str]) -> int:
        """Leading blocks of a match to attach: lower-tier ones only while loading beats recomputing."""
        return self.tier_costs.blocks_to_use(tiers, self.block_size)

    def _matched_tiers(self, hashes: list[int], num_tokens: int) -> list[str]:
        """Tiers of the leading blocks the cache holds, never the block of the last token: at least that
        token is computed, so that one is sampled."""
        usable = hashes[: (num_tokens - 1) // self.block_size]
        # the leading run on the device (most matched blocks), found in C
        tiers = ["device"] * len(list(takewhile(self.index.slots.__contains__, usable)))
        for h in usable[len(tiers) :]:
            tier = self._tier_of(h)
            if tier is None:
                break
            tiers.append(tier)
        return tiers

    def _tier_of(self, h: int) -> str | None:
        if self.index.slot_of(h) is not None:
            return "device"
        if self.cache_policy.lower_tiers and self.host is not None and self.host.has(h):
            return "host"
        if self.disk is not None and self.disk.has(h):
            return "disk"
        if self._remote_has(h):
            return "remote"
        return None

    def _attach(self, seq: Sequence, h: int, parent: int) -> str | None:
        """Adds h's block to seq's table: shared from the device, or promoted into a new device block."""
        block = self.index.slot_of(h)
        if block is not None:
            self._ref_indexed(block)
            seq.block_table.append(block)
            return "device"
        if self.pool.num_free == 0 and self._holder_budget(seq) == 0:
            return None
        block = self._take_block(seq)
        tier = self._tier_of(h)  # after the take: its eviction may have pushed lower-tier copies out
        if tier is None:
            self._free_taken(block)
            return None
        if tier == "host":
            slot = self.host.slot_of(h)
            self.mover.host_to_device(slot, block)
            self.host.hit(slot)
            self.stats.promotions_host += 1
        elif tier == "remote":
            if not self._remote_load(h, block):
                self._free_taken(block)
                return None
        elif self.mover.disk_read(h, block):
            self.stats.promotions_disk += 1  # recency: lookup_prefix touches the chain afterwards
        else:
            self.disk.remove(h)
            self.stats.disk_bad_files += 1
            self._free_taken(block)
            return None
        self.index.add(block, h, parent)
        self.policy.hit(block)
        seq.block_table.append(block)
        return tier

    def _free_taken(self, block: int) -> None:
        self.pool.decref(block)
        self.pool.put_free(block)

    def _share_indexed(self, seq: Sequence, hashes: list[int]) -> None:
        """Appends the device blocks indexed under these hashes (seq's next ones) to seq's table, shared."""
        blocks = list(map(self.index.slots.__getitem__, hashes))
        self._ref_indexed_all(blocks)
        seq.block_table += blocks
        seq.block_hashes += hashes

    def _ref_indexed(self, block: int) -> None:
        self._ref_indexed_all((block,))

    def _ref_indexed_all(self, blocks: Collection[int]) -> None:
        """One more reference to each of these indexed blocks (one that was cached
        leaves the eviction order)."""
        for block in self.pool.incref_all(blocks):
            self.policy.remove(block)
        self.policy.hit_all(blocks)  # a hit reads only the order's per-slot history, which leaving keeps

    # ---- allocation -----------------------------------------------------------------------------
    def allocation_due(self, seq: Sequence, total_tokens: int) -> bool:
        """Whether allocate(seq, total_tokens) would change anything: a block to add, full blocks to index
        (_commit), or a swap-in. Otherwise it does nothing and succeeds (the simulator skips such calls)."""
        bs, table = self.block_size, seq.block_table
        if (total_tokens + bs - 1) // bs > len(table):
            return True
        full = min(seq.num_computed_tokens // bs, len(table))
        if self.cache_policy.prefix_cache and len(seq.block_hashes) < full:
            return True
        return self.is_swapped(seq)

    def allocate(self, seq: Sequence, total_tokens: int) -> bool:
        """Grows seq's block table to hold total_tokens; all or nothing."""
        if self.is_swapped(seq) and not self.swap_in(seq):
            return False
        self._commit(seq)
        needed = blocks_for(total_tokens, self.block_size) - len(seq.block_table)
        if needed <= 0:
            return True  # most decode steps: the last block still has room
        # the eviction budget walks the policy and seq's table: only worth it when free blocks fall short
        if needed > self.pool.num_free and needed > self.pool.num_free + self._holder_budget(seq):
            return False
        self._take_blocks(seq, needed)
        return True

    def _take_blocks(self, seq: Sequence, n: int) -> None:
        """Appends n blocks to seq's table. Evictions go leaves first; the disk writes they bring wait until
        the end (the taken blocks still hold their old K/V: nothing computes before the writes copy it)
        and then go parents first (_write_evicted)."""
        if n > self.pool.num_free:
            self._disk_batch = []
        for _ in range(n):
            seq.block_table.append(self._take_block(seq))
        batch, self._disk_batch = self._disk_batch, None
        if batch:
            self._write_evicted(batch[::-1])

    def _write_evicted(self, blocks: list[tuple[int, int]]) -> None:
        """Disk writes of evicted device blocks (hash, block), given parents before children: queued in that
        order, so that a full write queue drops a tail, never the head that makes the rest usable; recorded
        tails first and then touched heads last, so that a full disk also lets tails go first."""
        queued = [h for h, block in blocks if self._disk_queue(h, "device", block)]
        for h in reversed(queued):
            self._disk_added(h)
        self.disk.touch_chain([h for h, _ in blocks])

    def _take_block(self, seq: Sequence) -> int:
        """A block for seq, free first, else by evicting a cached leaf (callers checked the budget)."""
        if self.pool.num_free:
            return self.pool.allocate()
        victim = self.policy.victim(self.index.is_leaf)
        assert victim is not None, "cached blocks without a leaf"
        self._evict(victim)
        self.pool.take(victim)
        return victim

    def _commit(self, seq: Sequence) -> None:
        """Indexes seq's newly completed blocks; a block someone else indexed first is shared instead."""
        if not self.cache_policy.prefix_cache:
            return
        bs = self.block_size
        full = min(seq.num_computed_tokens // bs, len(seq.block_table))
        i = len(seq.block_hashes)
        if i >= full:
            return
        parent = seq.block_hashes[-1] if i else ROOT
        keys = self.keys(seq)
        if self.cache_policy.heat_gated:  # the ghost's counts first: nothing below reads them
            self.ghost.record_all(keys[i:full], seq.request_id)
        index = self.index
        while i < full:
            h = keys[i]
            own = seq.block_table[i]
            existing = index.slots.get(h)
            if existing is None:
                index.add(own, h, parent)
                if self.remote is not None:  # computed here: peers may use it now
                    self._remote_offer(h, "device", own)
            elif existing != own:  # equal keys hold equal K/V: keep one copy
                self._ref_indexed(existing)
                seq.block_table[i] = existing
                self._unref(own)
            seq.block_hashes.append(h)
            parent = h
            i += 1

    # ---- release, demotion, eviction ------------------------------------------------------------
    def release(self, seq: Sequence) -> None:
        swapped = self._swapped.pop(id(seq), None)
        if swapped is not None:
            for slot in swapped[1]:
                self.host.unpin(slot)
        self._commit(seq)
        self._unref_all(seq.block_table)
        seq.block_table = []
        seq.block_hashes = []

    def trim(self, seq: Sequence, keep_blocks: int) -> None:
        """Gives back seq's blocks past its first keep_blocks (never an indexed one): the slots a speculative
        step took for proposals that were not accepted (engine/scheduler/speculation.py)."""
        keep = max(keep_blocks, len(seq.block_hashes))
        if keep >= len(seq.block_table) or self.is_swapped(seq):
            return
        tail = seq.block_table[keep:]
        del seq.block_table[keep:]
        self._unref_all(tail)

    def _unref_all(self, blocks: list[int]) -> None:
        """Drops one reference to each block; every full block no one holds any more stays cached, in its
        class, leaves first (a chain's tail becomes evictable before its head)."""
        pool = self.pool
        last = pool.decref_all(reversed(blocks))
        if not last:
            return
        cached, hashes = [], []
        for block, h in zip(last, self.index.hashes_of(last), strict=True):
            if h is None:
                pool.put_free(block)
            else:
                cached.append(block)
                hashes.append(h)
        earned = self._earned_all(hashes)
        self.policy.cool(sum(earned))  # protected traffic ages the protected class
        self.policy.add_all(cached, earned)

    def _unref(self, block: int) -> None:
        self._unref_all([block])

    def _earned(self, h: int) -> bool:
        """Whether a cached block keeps its place before others under pressure (the heat gate's rule)."""
        return self._earned_all((h,))[0]

    def _earned_all(self, hashes: Collection[int]) -> list[bool]:
        """_earned for each of these hashes (a release classes a whole table's blocks)."""
        if not self.cache_policy.heat_gated:
            return [True] * len(hashes)
        least = self.config.admit_min_requests
        return [n >= least for n in self.ghost.counts(hashes)]

    def _evict(self, block: int) -> None:
        parent = self.index.parent_of(block)
        h = self.index.remove(block)
        self.policy.forget(block)
        self.stats.evictions += 1
        self.regret.evicted(h)
        if not self._earned(h):
            self.stats.admissions_refused += 1  # evicted before it earned its place
        if self.cache_policy.lower_tiers:
            self._demote(block, h, parent)

    def _demote(self, block: int, h: int, parent: int) -> None:
        """Copies a block evicted from the device down (the only copy down: lazy, so blocks reused on the
        device never cost a copy): to the host as its gate allows (host_tier.py), to the
        disk past its threshold."""
        count = self.ghost.count(h)
        if self.copy_value is not None:
            self.copy_value.evicted(h, count)
        if self.host is not None and self.host.has(h):
            self.host.refresh(self.host.slot_of(h))  # coming down again: recent, and in its class as of now
        elif self.copy_value is not None and not self.copy_value.pays(count, self.block_size,
                                                                      self.tier_costs):
            self.stats.host_copies_skipped += 1
        elif self.host is not None:
            slot = self.host.acquire(self._host_evicted, self._host_admits(count))
            if slot is None:
                self.stats.host_copies_refused += 1
            else:
                self.mover.device_to_host(block, slot)
                self.host.insert(h, slot, parent)
                self.stats.demotions_host += 1
        if self.disk is not None and count >= self.config.disk_admit_min_requests:
            if self._disk_batch is not None:
                self._disk_batch.append((h, block))
            else:
                self._disk_write(h, "device", block)
        self._remote_offer(h, "device", block)  # the gate's count may have grown since it was committed

    def _host_earned(self, h: int) -> bool:
        """Whether a host copy keeps its place under pressure (the host tier's verdict on a hash)."""
        return self._host_admits(self.ghost.count(h))

    def _host_admits(self, offers: int) -> bool:
        """The host gate's rule: a copy offered by host_admit_min_requests distinct requests
        has earned its place."""
        return offers >= self.config.host_admit_min_requests

    def _host_evicted(self, slot: int, h: int) -> None:
        self.stats.host_evictions += 1
        if self.disk is not None and self.ghost.count(h) >= self.config.disk_admit_min_requests:
            self._disk_write(h, "host", slot)
        self._remote_offer(h, "host", slot)

    def _disk_write(self, h: int, tier: str, index: int) -> None:
        if self._disk_queue(h, tier, index):
            self._disk_added(h)
        else:
            self.disk.touch(h)  # already there (or dropped: then touching does nothing)

    def _disk_queue(self, h: int, tier: str, index: int) -> bool:
        """Queues a write of h unless the disk has it; False when it has, or the queue is full (counted)."""
        if self.disk.has(h):
            return False
        if not self.mover.disk_write(h, tier, index):
            self.stats.disk_writes_dropped += 1
            return False
        self.stats.demotions_disk += 1
        return True

    def _disk_added(self, h: int) -> None:
        self.stats.disk_writes += 1
        for victim in self.disk.add(h):
            self.mover.disk_delete(victim)
            self.stats.disk_evictions += 1

    # ---- reporting ------------------------------------------------------------------------------
    def flush(self) -> None:
        """Waits for queued disk writes (tests, shutdown)."""
        self.mover.flush()

    def check_integrity(self, live: Iterable[Sequence]) -> None:
        """Every block is in exactly one of free / referenced / cached; refcounts equal the number of
        tables holding the block; the index is prefix-closed; host pins match swapped sequences."""
        check_manager(self, list(live))
