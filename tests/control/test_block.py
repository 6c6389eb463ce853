"""The control block's layout, seqlock and checksum."""

from __future__ import annotations

import struct

import pytest
from kvloop.engine.control import layout as L
from kvloop.engine.control.block import ControlBlock, ControlBlockError
from kvloop.engine.control.records import (
    Targets,
    pack_snapshot,
    pack_targets,
    unpack_snapshot,
    unpack_targets,
)


def test_header_and_size(tmp_path):
    path = tmp_path / "c.bin"
    ControlBlock(path, create=True).close()
    data = path.read_bytes()
    assert len(data) == L.FILE_SIZE
    magic, version, hsize, soff, ssize, toff, tsize = L.HEADER_FMT.unpack_from(data)
    assert (magic, version, hsize) == (b"KVLOOPCB", 1, 64)
    assert (soff, toff) == (L.SNAPSHOT_OFFSET, L.TARGETS_OFFSET)


def test_open_without_create_needs_a_valid_file(tmp_path):
    with pytest.raises(ControlBlockError):
        ControlBlock(tmp_path / "missing.bin")
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"x" * L.FILE_SIZE)
    with pytest.raises(ControlBlockError):
        ControlBlock(bad)
    ControlBlock(bad, create=True).close()  # the engine repairs it
    ControlBlock(bad).close()


def test_snapshot_roundtrip_with_optional_and_nested_keys():
    snap = {"num_waiting": 3, "kv_usage": 0.5, "num_preemptions": 7, "prefix_hits": {"host": 11},
            "num_running": -1, "batch_cap": 2**40}  # bad values are clamped, never raised on
    out = unpack_snapshot(pack_snapshot(snap, start_id=42, step=9, time_ns=123))
    assert out["start_id"] == 42 and out["step"] == 9 and out["time_ns"] == 123
    assert out["num_waiting"] == 3 and out["kv_use_device"] == 0.5 and out["preemptions"] == 7
    assert out["prefix_hits_host"] == 11 and out["num_running"] == 0 and out["batch_cap"] == 2**32 - 1
    assert out["ttft_p99_s"] != out["ttft_p99_s"]  # NaN: unknown


def test_targets_roundtrip_with_unset_knobs():
    t = unpack_targets(pack_targets(Targets(batch_cap=8, watermark=None, version=3, time_ns=5, writer_id=9)))
    assert (t.batch_cap, t.watermark, t.version, t.time_ns, t.writer_id) == (8, None, 3, 5, 9)


def test_seqlock_and_checksum(tmp_path):
    block = ControlBlock(tmp_path / "c.bin", create=True)
    off, size = L.TARGETS_OFFSET, L.TARGETS_FMT.size
    assert block.read(off, size) == (0, b"")  # never written
    payload = pack_targets(Targets(4, 0.2, version=1, time_ns=1))
    block.write(off, payload)
    assert block.read(off, size) == (2, payload)
    block.write(off, payload)
    assert block.read(off, size)[0] == 4  # two increments per write: even when settled
    # a flipped payload byte fails the crc
    block.mm[off + L.RECORD_HEAD.size + 3] ^= 0xFF
    assert block.read(off, size) == (4, None)
    # a writer that died inside the record leaves the seq odd: readers report busy, the next writer moves on
    struct.pack_into("<Q", block.mm, off, 5)
    seq, got = block.read(off, size)
    assert seq % 2 == 1 and got is None
    block.write(off, payload)
    assert block.read(off, size) == (8, payload)
    block.close()
