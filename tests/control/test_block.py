"""The control block's layout, seqlock and checksum."""

from __future__ import annotations

import struct

import pytest

from kvloop.engine.control import layout as L
from kvloop.engine.control.block import ControlBlock, ControlBlockError
from kvloop.engine.control.records import (
    Targets,
    control_record,
    pack_record,
    pack_targets,
    unpack_record,
    unpack_targets,
)
from kvloop.engine.core.kv_stats import KVStats
from kvloop.engine.core.snapshot import EngineSnapshot


def test_header_and_size(tmp_path):
    path = tmp_path / "c.bin"
    ControlBlock(path, create=True).close()
    data = path.read_bytes()
    assert len(data) == L.FILE_SIZE
    magic, version, hsize, soff, ssize, toff, tsize = L.HEADER_FMT.unpack_from(data)
    assert (magic, version, hsize) == (b"KVLOOPCB", L.LAYOUT_VERSION, 64)
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


def test_a_reader_refuses_another_layout_version_naming_both(tmp_path):
    path = tmp_path / "old.bin"
    ControlBlock(path, create=True).close()
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 8, L.LAYOUT_VERSION - 1)  # as an engine of the previous layout wrote it
    path.write_bytes(bytes(data))
    with pytest.raises(ControlBlockError) as err:
        ControlBlock(path)  # the sidecar's open
    message = str(err.value)
    assert f"layout version {L.LAYOUT_VERSION - 1}" in message
    assert f"reads version {L.LAYOUT_VERSION}" in message
    ControlBlock(path, create=True).close()  # the engine, the block's owner, writes its own layout anew
    ControlBlock(path).close()


def test_snapshot_record_roundtrip_and_clamps():
    snap = EngineSnapshot(num_waiting=3, kv_usage=0.5, num_preemptions=7, num_running=-1, batch_cap=2**40,
                          kv_host_blocks_used=4, kv_host_blocks_total=16, requests_finished=5,
                          tokens_generated=80,
                          kv_stats=KVStats(query_tokens_device=100, query_tokens_host=60,
                                           query_tokens_disk=30,
                                           hit_tokens_host=11))  # bad values are clamped, never raised on
    out = unpack_record(pack_record(control_record(snap, (float("nan"), 0.25), start_id=42, step=9,
                                                   time_ns=123)))
    assert (out.start_id, out.step, out.time_ns) == (42, 9, 123)
    assert out.num_waiting == 3 and out.kv_use_device == 0.5 and out.preemptions == 7
    assert out.prefix_hits_host == 11 and out.num_running == 0 and out.batch_cap == 2**32 - 1
    assert (out.prefix_queries_device, out.prefix_queries_host, out.prefix_queries_disk) == (100, 60, 30)
    assert (out.requests_finished, out.tokens_generated, out.kv_use_host, out.kv_use_disk) == (5, 80, 0.25,
                                                                                               0.0)
    assert out.ttft_p50_s != out.ttft_p50_s and out.ttft_p99_s == 0.25  # NaN: unknown
    assert out.as_dict()["ttft_p50_s"] is None
    assert out.tpot_p50_s != out.tpot_p50_s and out.as_dict()["tpot_p99_s"] is None  # no finished request yet


def test_layout_3_snapshot_roundtrip_of_the_new_fields():
    snap = EngineSnapshot(num_running=6, num_decoding=4, step_token_budget=384, step_token_budget_max=512,
                          kv_blocks_total=800, kv_blocks_free=300, kv_blocks_pending=40, block_size=16,
                          max_model_len=4096)
    out = unpack_record(pack_record(control_record(snap, (0.1, 0.9), (0.03, 0.08))))
    assert (out.num_decoding, out.step_token_budget, out.step_token_budget_max) == (4, 384, 512)
    assert (out.kv_blocks_pending, out.block_size, out.max_model_len) == (40, 16, 4096)
    assert (out.ttft_p50_s, out.ttft_p99_s, out.tpot_p50_s, out.tpot_p99_s) == (0.1, 0.9, 0.03, 0.08)


def test_layout_4_and_later_carry_the_slo_counts():
    snap = EngineSnapshot(slo_good=7, slo_missed={"ttft": 2, "tpot": 1}, slo_slack_sum=3.5, slo_slack_count=9)
    out = unpack_record(pack_record(control_record(snap, (None, None), (None, None))))
    assert (out.slo_good, out.slo_missed_ttft, out.slo_missed_tpot, out.slo_missed_failed) == (7, 2, 1, 0)
    assert (out.slo_slack_sum, out.slo_slack_count) == (3.5, 9)
    assert L.LAYOUT_VERSION >= 4


def test_a_reader_of_this_layout_refuses_a_layout_2_block(tmp_path):
    """A block as a version-2 engine wrote it (its header says 2, its targets record is the shorter one): the
    sidecar refuses it cleanly, naming both versions, and reads nothing from it."""
    path = tmp_path / "v2.bin"
    head = L.HEADER_FMT.pack(L.MAGIC, 2, L.HEADER_SIZE, L.SNAPSHOT_OFFSET, L.SNAPSHOT_SIZE, L.TARGETS_OFFSET,
                             L.TARGETS_SIZE).ljust(L.HEADER_SIZE, b"\0")
    path.write_bytes(head.ljust(L.FILE_SIZE, b"\0"))
    with pytest.raises(ControlBlockError) as err:
        ControlBlock(path)
    assert str(err.value).endswith(f"control block layout version 2, but this kvloop reads version "
                                   f"{L.LAYOUT_VERSION}: run the engine and the sidecar from kvloop releases "
                                   "with the same layout")


def test_targets_roundtrip_with_unset_knobs():
    t = unpack_targets(pack_targets(Targets(batch_cap=8, watermark=None, version=3, time_ns=5, writer_id=9)))
    assert (t.batch_cap, t.watermark, t.step_token_budget, t.version, t.time_ns,
            t.writer_id) == (8, None, None, 3, 5, 9)
    t = unpack_targets(pack_targets(Targets(step_token_budget=256)))
    assert t.values() == (None, None, 256, None)
    assert unpack_targets(pack_targets(Targets(16, 0.2, 1024))).values() == (16, 0.2, 1024, None)
    assert unpack_targets(pack_targets(Targets(speculation_max_tokens=0))).values() == (None, None, None, 0)


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
