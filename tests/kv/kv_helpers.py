"""Helpers shared by the KV tests: greedy requests, a content-tracking fake mover, token streams, a KV
manager over that mover and one request served through it."""

from __future__ import annotations

import random
from collections import deque

from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.core.sequence import Sequence
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.kv.hashing import chain_hashes
from kvloop.engine.kv.manager import KVCacheManager

ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(n)]


def run(engine, rid: str, ids: list[int], n: int = 4):
    """Runs one request to completion on an engine; returns (final output, sequence)."""
    seq = engine.add_request(rid, ids, greedy(n))
    out = engine.drain(max_steps=300)[rid]
    engine.scheduler.check_integrity()
    return out, seq


class FakeMover:
    """Stands in for the tensor mover: each device block, host slot and disk file holds the token prefix
    whose K/V it would hold, so tests can check that every copy lands where the policy says."""

    def __init__(self, kv, extra: bytes = b""):
        self.kv = kv
        self.extra = extra
        self.device: dict[int, tuple] = {}
        self.host: dict[int, tuple] = {}
        self.disk: dict[int, tuple] = {}
        self.truth: dict[int, tuple] = {}  # block hash -> the token prefix it stands for
        self.bad: set[int] = set()  # disk files to report as corrupt on read
        self.drop_next_write = False

    # the model's side: writing K/V for tokens [start, end) of seq
    def compute(self, seq: Sequence, start: int, end: int) -> None:
        bs = self.kv.block_size
        for i in range(start // bs, (end + bs - 1) // bs):
            block = seq.block_table[i]
            assert self.kv.index.hash_of(block) is None, "writing into an indexed (shared) block"
            assert self.kv.pool.ref_counts[block] == 1, "writing into a block others hold"
            self.device[block] = tuple(seq.token_ids[: min((i + 1) * bs, end)])
        for i, h in enumerate(chain_hashes(seq.token_ids[:end], bs, self.extra)):
            self.truth[h] = tuple(seq.token_ids[: (i + 1) * bs])

    def device_to_host(self, block: int, slot: int) -> None:
        self.host[slot] = self.device[block]

    def host_to_device(self, slot: int, block: int) -> None:
        self.device[block] = self.host[slot]

    def disk_write(self, h: int, tier: str, index: int) -> bool:
        if self.drop_next_write:
            self.drop_next_write = False
            return False
        self.disk[h] = (self.device if tier == "device" else self.host)[index]
        return True

    def disk_read(self, h: int, block: int) -> bool:
        if h in self.bad or h not in self.disk:
            self.bad.discard(h)
            self.disk.pop(h, None)
            return False
        self.device[block] = self.disk[h]
        return True

    def disk_delete(self, h: int) -> None:
        self.disk.pop(h, None)

    def disk_scan(self) -> list[int]:
        return list(self.disk)

    def flush(self) -> None:
        pass

    def check(self, live: list[Sequence]) -> None:
        """Every cached copy anywhere holds the content its hash names; live tables hold their tokens."""
        kv, bs = self.kv, self.kv.block_size
        for block, (h, _) in kv.index.entries().items():
            assert self.device.get(block) == self.truth[h], f"device block {block} holds the wrong K/V"
        if kv.host is not None:
            for slot in range(kv.host.num_slots):
                h = kv.host.hash_of(slot)
                if h is not None:
                    assert self.host.get(slot) == self.truth[h], f"host slot {slot} holds the wrong K/V"
        if kv.disk is not None:
            for h in list(kv.disk._lru):
                assert self.disk.get(h) == self.truth[h], "disk file holds the wrong K/V"
        for seq in live:
            for i, block in enumerate(seq.block_table):
                end = min((i + 1) * bs, seq.num_computed_tokens)
                if end > i * bs:
                    expected = tuple(seq.token_ids[:end])
                    assert self.device.get(block) == expected, f"{seq.request_id}: block {i} wrong"


def fake_manager(num_blocks: int, block_size: int, config: KVConfig, extra_key: str) -> KVCacheManager:
    """A KV manager without a model: its mover is a FakeMover keyed like the manager."""
    kv = KVCacheManager(num_blocks, block_size, config, extra_key=extra_key)
    kv.attach_mover(FakeMover(kv, extra_key.encode()))
    return kv


def serve(kv: KVCacheManager, rid: str, ids: list[int]) -> int:
    """Admits, 'computes' and releases one request on a fake_manager as the engine would; returns its prefix
    hit. The invariants are checked while it holds its blocks and after."""
    seq = Sequence(rid, ids, ONE_TOKEN)
    hit = kv.lookup_prefix(seq)
    assert kv.allocate(seq, len(ids))
    kv.mover.compute(seq, hit, len(ids))
    seq.num_computed_tokens = len(ids)
    kv.check_integrity([seq])
    kv.release(seq)
    kv.check_integrity([])
    return hit


def manager_state(kv) -> object:
    """The KV manager's whole state in plain, order-sensitive form (LRU order and CLOCK hands count), for
    checking that a read changed nothing. The mover and the memos of block keys are left out."""

    def plain(x):
        if isinstance(x, dict):
            return [(k, plain(v)) for k, v in x.items()]
        if isinstance(x, (list, tuple, deque)):
            return [plain(v) for v in x]
        if hasattr(x, "__dict__"):
            return (type(x).__name__, plain(vars(x)))
        return x

    return plain({k: v for k, v in vars(kv).items() if k not in ("mover", "_keys", "_hasher", "config")})
