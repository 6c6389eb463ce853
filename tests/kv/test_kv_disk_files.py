"""The tier mover's disk files on small tensors: round trip, header checks, damage, the bounded
write-behind queue and the directory scan; the KV manager over them: disk writes in prefix order, the
shutdown flush (persist), and a restarted manager serving a partly written prefix."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from kv_helpers import greedy

from kvloop.engine.core.sequence import Sequence
from kvloop.engine.kv import disk_format as fmt
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.kv.manager import KVCacheManager
from kvloop.engine.kv.mover_api import NullMover
from kvloop.engine.kv.tier_mover import TierMover


@pytest.fixture
def kv_cache():
    torch.manual_seed(0)
    return torch.randn(3, 2, 6, 4, 2, 8)  # layers, k/v, blocks, block size, kv heads, head dim


def written(kv_cache, tmp_path, fingerprint="fp", **kw) -> TierMover:
    mover = TierMover(kv_cache, host_slots=2, disk_dir=str(tmp_path), fingerprint=fingerprint, **kw)
    for h, block in ((11, 1), (12, 2), (13, 3)):
        assert mover.disk_write(h, "device", block)
    mover.flush()
    return mover


def test_round_trip_and_host_copies(kv_cache, tmp_path):
    mover = written(kv_cache, tmp_path)
    assert sorted(mover.disk_scan()) == [11, 12, 13]
    assert mover.disk_read(12, 5)
    assert torch.equal(kv_cache[:, :, 5], kv_cache[:, :, 2])
    mover.device_to_host(1, 0)
    mover.host_to_device(0, 4)
    assert torch.equal(kv_cache[:, :, 4], kv_cache[:, :, 1])
    mover.close()


def damage(path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[-7] ^= 0x10
    elif how == "truncate":
        data = data[: len(data) - 100]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["flip", "truncate", "foreign", "missing"])
def test_damaged_files_are_misses_and_deleted(kv_cache, tmp_path, how):
    mover = written(kv_cache, tmp_path)
    path = tmp_path / fmt.file_name(12)
    before = kv_cache[:, :, 5].clone()
    if how == "foreign":  # the same name written by an engine with another model fingerprint
        other = TierMover(kv_cache.clone(), disk_dir=str(tmp_path / "other"), fingerprint="other-model")
        assert other.disk_write(12, "device", 2)
        other.flush()
        os.replace(tmp_path / "other" / fmt.file_name(12), path)
    elif how == "missing":
        path.unlink()
    else:
        damage(path, how)
    assert not mover.disk_read(12, 5)
    assert not path.exists()
    assert torch.equal(kv_cache[:, :, 5], before)  # nothing half-copied
    assert mover.disk_read(13, 5)  # the others are fine


def test_full_queue_drops_writes_and_pending_writes_are_readable(kv_cache, tmp_path, monkeypatch):
    mover = TierMover(kv_cache, disk_dir=str(tmp_path), fingerprint="fp", queue_size=1)
    gate = threading.Event()
    real_write = mover._write
    monkeypatch.setattr(mover, "_write", lambda h, data: (gate.wait(), real_write(h, data)))
    assert mover.disk_write(0, "device", 0)
    while not mover._queue.empty():  # the writer takes it and gets stuck
        time.sleep(0.001)
    results = [mover.disk_write(h, "device", h) for h in (1, 2, 3)]
    assert results == [True, False, False]  # one queued, then the queue is full: dropped, not waited for
    assert mover.disk_read(1, 5)  # a queued write is served from memory
    assert torch.equal(kv_cache[:, :, 5], kv_cache[:, :, 1])
    gate.set()
    mover.flush()
    assert sorted(mover.disk_scan()) == [0, 1]


def test_scan_removes_leftovers_and_ignores_strangers(kv_cache, tmp_path):
    mover = written(kv_cache, tmp_path)
    (tmp_path / ".x.kvb.1.tmp").write_bytes(b"half")
    (tmp_path / "notes.txt").write_text("hi")
    assert sorted(mover.disk_scan()) == [11, 12, 13]
    assert not (tmp_path / ".x.kvb.1.tmp").exists() and (tmp_path / "notes.txt").exists()


def test_bf16_blocks_round_trip(tmp_path):
    kv = torch.randn(2, 2, 3, 4, 1, 8).to(torch.bfloat16)
    mover = TierMover(kv, disk_dir=str(tmp_path), fingerprint="fp")
    assert mover.disk_write(7, "device", 0)
    mover.flush()
    assert mover.disk_read(7, 2) and torch.equal(kv[:, :, 2], kv[:, :, 0])


# ---- the KV manager over the disk files: prefix order, the shutdown flush, a restart ----------------------
BS = 4


def disk_manager(kv_cache, tmp_path, **kw) -> KVCacheManager:
    """A codesign manager over kv_cache with a disk tier in tmp_path and no host tier; released blocks
    stay cached on the device (a gate of one request), so only the shutdown flush writes them."""
    cfg = KVConfig(mode="codesign", host_cache_tokens=0, disk_dir=str(tmp_path), min_prefix_tokens=BS,
                   admit_min_requests=1, **kw)
    kv = KVCacheManager(kv_cache.shape[2], BS, cfg, extra_key="fp")
    kv.attach_mover(TierMover.for_manager(kv, kv_cache, "fp"))
    return kv


def serve_once(kv: KVCacheManager, ids: list[int], rid: str) -> Sequence:
    """Admits ids, 'computes' them (the K/V already sit in the tensor) and releases the sequence."""
    seq = Sequence(rid, list(ids), greedy(1))
    seq.token_ids = list(ids)
    kv.lookup_prefix(seq)
    assert kv.allocate(seq, len(ids))
    seq.num_computed_tokens = len(ids)
    kv.release(seq)
    kv.check_integrity([])
    return seq


class RecordingMover(NullMover):
    """Accepts `room` disk writes, then reports a full queue; records what it was asked to write."""

    def __init__(self, room: int):
        self.room = room
        self.written: list[int] = []

    def disk_write(self, h: int, tier: str, index: int, timeout: float = 0.0) -> bool:
        if len(self.written) == self.room:
            return False
        self.written.append(h)
        return True


def test_a_full_queue_drops_the_tail_of_an_evicted_prefix_not_its_head():
    cfg = KVConfig(mode="codesign", host_cache_tokens=0, disk_dir="unused", disk_admit_min_requests=1,
                   min_prefix_tokens=BS)
    kv = KVCacheManager(8, BS, cfg)
    mover = RecordingMover(room=3)
    kv.mover = mover
    ids = list(range(100, 100 + 6 * BS + 1))
    seq = serve_once(kv, ids, "a")  # cached on the device: nothing written yet
    assert mover.written == []
    serve_once(kv, list(range(900, 900 + 8 * BS)), "filler")  # evicts all six, leaves first
    assert mover.written == kv.keys(seq)[:6][:3]  # written parents first: the head, which a restart can use
    assert kv.stats.disk_writes_dropped == 3


def test_shutdown_flush_then_restart_serves_the_blocks_in_prefix_order(kv_cache, tmp_path):
    ids = list(range(200, 200 + 5 * BS + 2))  # 5 full blocks
    kv = disk_manager(kv_cache, tmp_path)
    seq = serve_once(kv, ids, "a")
    assert not list(tmp_path.glob("*.kvb"))
    hashes = kv.keys(seq)[:5]
    assert [h for h, _, _ in kv.persist_plan()] == hashes  # parents before children
    assert kv.persist(time.monotonic() + 30) == {"written": 5, "skipped": 0, "on_disk": 5}
    original = {h: kv_cache[:, :, kv.index.slot_of(h)].clone() for h in hashes}
    assert kv.mover.disk_scan() == hashes[::-1]  # a restart's LRU: the head is the most recent
    assert sorted(p.name for p in tmp_path.glob("*.kvb")) == sorted(fmt.file_name(h) for h in hashes)
    kv.mover.close()

    # a flush cut short by its deadline left the first three: a restart serves those three, from disk
    for h in hashes[3:]:
        (tmp_path / fmt.file_name(h)).unlink()
    fresh = torch.zeros_like(kv_cache)
    restarted = disk_manager(fresh, tmp_path)
    seq = Sequence("d", list(ids), greedy(1))
    seq.token_ids = list(ids)
    assert restarted.lookup_prefix(seq) == 3 * BS
    assert seq.cached_tokens_by_tier == {"disk": 3 * BS}
    for i, h in enumerate(hashes[:3]):
        assert torch.equal(fresh[:, :, seq.block_table[i]], original[h])  # the K/V themselves came back
    restarted.release(seq)
    restarted.check_integrity([])
    restarted.mover.close()


def test_a_gap_in_the_chain_ends_the_match(kv_cache, tmp_path):
    ids = list(range(300, 300 + 4 * BS + 1))
    kv = disk_manager(kv_cache, tmp_path)
    seq = serve_once(kv, ids, "a")
    kv.persist(time.monotonic() + 30)
    kv.mover.close()
    (tmp_path / fmt.file_name(kv.keys(seq)[1])).unlink()  # block 1 missing: blocks 2 and 3 are unusable
    restarted = disk_manager(torch.zeros_like(kv_cache), tmp_path)
    again = Sequence("b", list(ids), greedy(1))
    again.token_ids = list(ids)
    assert restarted.lookup_prefix(again) == BS
    restarted.release(again)
    restarted.mover.close()


def test_a_flush_past_its_deadline_writes_nothing(kv_cache, tmp_path):
    kv = disk_manager(kv_cache, tmp_path)
    serve_once(kv, list(range(400, 400 + 3 * BS)), "a")
    assert kv.persist(time.monotonic() - 1) == {"written": 0, "skipped": 3, "on_disk": 0}
    kv.mover.close()


def test_flush_plan_orders_host_blocks_by_their_chain(kv_cache, tmp_path):
    cfg = KVConfig(mode="codesign", host_cache_tokens=8 * BS, disk_dir=str(tmp_path), min_prefix_tokens=BS,
                   disk_admit_min_requests=3)  # evictions reach the host only: the flush has them to write
    kv = KVCacheManager(kv_cache.shape[2], BS, cfg, extra_key="fp")
    kv.attach_mover(TierMover.for_manager(kv, kv_cache, "fp"))
    seq = serve_once(kv, list(range(500, 500 + 5 * BS)), "a")
    serve_once(kv, list(range(500, 500 + 5 * BS)), "b")  # offered twice: copied to the host when evicted
    serve_once(kv, list(range(800, 800 + 6 * BS)), "filler")  # evicts them (its own blocks: once, not copied)
    assert not any(kv.index.slot_of(h) is not None for h in kv.keys(seq)) and kv.host.num_used == 5
    plan = kv.persist_plan()
    assert [p for p in plan if p[1] == "host"] == [(h, "host", kv.host.slot_of(h)) for h in kv.keys(seq)]
    kv.mover.close()


def test_shutdown_writes_wait_for_room_and_flush_has_a_deadline(kv_cache, tmp_path, monkeypatch):
    mover = TierMover(kv_cache, disk_dir=str(tmp_path), fingerprint="fp", queue_size=1)
    gate = threading.Event()
    real_write = mover._write
    monkeypatch.setattr(mover, "_write", lambda h, data: (gate.wait(), real_write(h, data)))
    assert mover.disk_write(0, "device", 0)
    while not mover._queue.empty():  # the writer takes it and gets stuck
        time.sleep(0.001)
    assert mover.disk_write(1, "device", 1, timeout=0.01)  # room for one
    started = time.monotonic()
    assert not mover.disk_write(2, "device", 2, timeout=0.05)  # waited, then gave up
    assert time.monotonic() - started >= 0.05
    assert not mover.flush(timeout=0.01)
    gate.set()
    assert mover.flush(timeout=10)
    assert sorted(mover.disk_scan()) == [0, 1]
    mover.close()


def test_a_full_disk_evicts_tails_before_the_heads_they_need():
    cfg = KVConfig(mode="codesign", host_cache_tokens=0, disk_dir="unused", disk_admit_min_requests=1,
                   min_prefix_tokens=BS, disk_cache_tokens=4 * BS)
    kv = KVCacheManager(8, BS, cfg)
    kv.mover = RecordingMover(room=100)
    first = serve_once(kv, list(range(600, 600 + 3 * BS + 1)), "a")
    serve_once(kv, list(range(700, 700 + 3 * BS + 1)), "b")
    serve_once(kv, list(range(800, 800 + 8 * BS)), "c")  # evicts both prefixes: six writes, two must go
    head = kv.keys(first)[0]
    assert kv.disk.has(head) and not any(kv.disk.has(h) for h in kv.keys(first)[1:3])
    assert kv.stats.disk_evictions == 2
