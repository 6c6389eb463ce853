"""The field tables are the one description of the records: formats, record types, mapping and docs
follow them, and layout version 5's bytes stay where the sidecar and engine of one release expect them."""

from __future__ import annotations

import dataclasses
import math
import struct

import pytest

from kvloop.engine.control import fields as F
from kvloop.engine.control import layout as L
from kvloop.engine.control.records import (
    ControlRecord,
    Targets,
    admitted,
    control_record,
    pack_targets,
    unpack_targets,
)
from kvloop.engine.core.knobs import KNOBS, Knobs, KnobValues
from kvloop.engine.core.snapshot import EngineSnapshot

# The bytes of layout version 5 (4, whose targets' pad word now carries the speculation cap). A table
# change that moves them must raise LAYOUT_VERSION and this pin.
V5_SNAPSHOT = "<QQq" + "I" * 12 + "d" * 4 + "Q" * 16 + "d" * 5
V5_TARGETS = "<QqQIIdII"


def test_layout_5_keeps_its_bytes():
    assert L.LAYOUT_VERSION == 5
    assert (L.SNAPSHOT_FMT.format, L.TARGETS_FMT.format) == (V5_SNAPSHOT, V5_TARGETS)
    assert L.TARGETS_FIELDS == ("version", "time_ns", "writer_id", "flags", "batch_cap", "watermark",
                                "step_token_budget", "speculation_max_tokens")
    assert L.TARGETS_FMT.size == 48  # version 4's size: the cap took its pad word


def test_the_speculation_cap_sits_in_version_4s_pad_word():
    payload = pack_targets(Targets(speculation_max_tokens=3))
    assert struct.unpack_from("<I", payload, 44)[0] == 3
    bit = [k.name for k in KNOBS].index("speculation_max_tokens")
    assert struct.unpack_from("<I", payload, 24)[0] == 1 << bit  # flags


def test_the_record_types_carry_the_tables_fields():
    names = [f.name for f in dataclasses.fields(ControlRecord)]
    assert names == [f.name for f in F.SNAPSHOT if f.name != F.PAD] + ["age_s"]
    knob_names = tuple(k.name for k in KNOBS)
    assert tuple(f.name for f in dataclasses.fields(Targets))[: len(KNOBS)] == knob_names
    assert tuple(f.name for f in F.TARGET_KNOBS) == knob_names
    for name in (f.name for f in F.SNAPSHOT + F.TARGETS):
        assert name in L.__doc__  # the docs list every field


def test_every_snapshot_field_is_mapped_from_the_snapshot_or_given_by_the_writer():
    snap = EngineSnapshot(num_waiting=1, num_running=2, num_decoding=3, batch_cap=4, step_token_budget=5,
                          step_token_budget_max=6, kv_blocks_total=7, kv_blocks_free=8, kv_blocks_pending=9,
                          block_size=10, max_model_len=11, watermark=0.12, kv_usage=0.13, num_preemptions=14,
                          num_rejections=15, num_oom_events=16, requests_finished=17, tokens_generated=18)
    rec = control_record(snap, (0.19, 0.2), (0.21, 0.22), start_id=23, step=24, time_ns=25)
    want = dict(start_id=23, step=24, time_ns=25, num_waiting=1, num_running=2, num_decoding=3, batch_cap=4,
                step_token_budget=5, step_token_budget_max=6, kv_blocks_total=7, kv_blocks_free=8,
                kv_blocks_pending=9, block_size=10, max_model_len=11, watermark=0.12, kv_use_device=0.13,
                preemptions=14, rejections=15, oom_events=16, requests_finished=17, tokens_generated=18,
                ttft_p50_s=0.19, ttft_p99_s=0.2, tpot_p50_s=0.21, tpot_p99_s=0.22)
    assert {k: getattr(rec, k) for k in want} == want


def test_integers_saturate_to_their_type_when_packed():
    by_name = {f.name: f for f in F.SNAPSHOT}
    assert by_name["num_running"].pack(-5) == 0 and by_name["batch_cap"].pack(2**40) == F.U32
    assert by_name["preemptions"].pack(2**70) == F.U64 and by_name["time_ns"].pack(-7) == -7
    assert math.isnan(by_name["watermark"].pack(None))
    # an absurd target packs (and is refused on reading), never raises in the writer
    t = unpack_targets(pack_targets(Targets(batch_cap=2**40)))
    assert t.batch_cap == F.U32 and not admitted(t)


@pytest.mark.parametrize("values, ok", [
    ((8, 0.5, 256), True), ((None, None, None), False), ((0, None, None), False),
    ((None, 1.0, None), False), ((None, math.nan, None), False), ((None, None, 0), False),
    ((1 << 16, 0.0, 1 << 24), True), ((None, None, (1 << 24) + 1), False),
    ((None, None, None, 0), True), ((None, None, None, 64), True), ((None, None, None, 65), False),
    ((8, 0.5, 256, 4), True),
])
def test_targets_are_judged_by_their_knobs_ranges(values, ok):
    assert admitted(Targets(*values)) is ok


def test_knobs_check_clamp_and_remember_their_configured_values():
    k = Knobs(32, 0.2, 1024, block_size=16)
    k.set(step_token_budget=5000)
    assert k.step_token_budget == 1024  # the configured budget is the ceiling
    k.set(step_token_budget=3, batch_cap=7)
    assert (k.step_token_budget, k.batch_cap) == (16, 7)  # floor: a block, at least 16 tokens
    with pytest.raises(ValueError):
        k.set(watermark=1.0)
    with pytest.raises(ValueError):
        k.set(batch_cap=0)
    assert k.configured == KnobValues(32, 0.2, 1024) and k.values() == KnobValues(7, 0.2, 16)
    assert Knobs(8, 0.0, 8, block_size=16).budget_floor == 8  # a configured budget below a block is kept


def test_the_speculation_cap_lowers_never_raises_the_configured_value():
    k = Knobs(32, 0.2, 1024, speculation_max_tokens=4)
    assert k.configured.speculation_max_tokens == k.speculation_max_tokens == 4
    k.set(speculation_max_tokens=2)
    assert k.speculation_max_tokens == 2
    k.set(speculation_max_tokens=64)
    assert k.speculation_max_tokens == 4  # a target cannot raise it past the operator's
    k.set(speculation_max_tokens=0)
    assert k.values() == KnobValues(32, 0.2, 1024, 0)  # 0: speculation off live


def test_the_targets_flags_follow_the_knob_order():
    payload = pack_targets(Targets(watermark=0.3))
    flags = struct.unpack_from("<I", payload, 24)[0]
    assert flags == 1 << [k.name for k in KNOBS].index("watermark")
