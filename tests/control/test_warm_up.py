"""The server's warm-up request stays out of the control block and the finish counters: its 4-token footprint
once placed the coordinator's first batch cap before any user request, and its TTFT (lazy set-up included)
would read as a P99 breach."""

from __future__ import annotations

import math

from kvloop.engine.control.link import SidecarLink
from kvloop.engine.core.sampling import SamplingParams


def test_warm_up_is_not_published_or_counted(make_engine, tmp_path):
    path = tmp_path / "control.bin"
    engine = make_engine(control_file=str(path))
    side = SidecarLink(path)
    engine.warm_up()
    assert not engine.has_unfinished()
    assert engine.num_steps >= 1  # it ran the model
    assert side.read_snapshot() is None  # nothing published while it ran
    engine.step()  # the first step after warm-up publishes the idle engine
    snap = side.read_snapshot()
    assert snap.num_running == 0 and snap.requests_finished == 0 and snap.tokens_generated == 0
    assert math.isnan(snap.ttft_p99_s) and math.isnan(snap.tpot_p99_s)
    engine.add_request("user", [5, 6, 7, 8, 9], SamplingParams(max_tokens=3, ignore_eos=True))
    engine.step()
    snap = side.read_snapshot()
    assert snap.num_running == 1 and not math.isnan(snap.ttft_p99_s)  # the control hook is back
    engine.drain(max_steps=10)
    engine.step()
    assert side.read_snapshot().requests_finished == 1 and side.read_snapshot().tokens_generated == 3
    engine.control.close()
