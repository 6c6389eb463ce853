"""The tier mover's disk files on small tensors: round trip, header checks, damage, the bounded
write-behind queue and the directory scan."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from kvloop.engine.kv import disk_format as fmt
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
