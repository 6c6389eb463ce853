"""Two processes share the control block: targets written by another process (the `kvloop control`
CLI, as the sidecar would) are applied by a real engine within one step; garbled and stale targets
are ignored and counted; a restart changes the start id."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from kvloop.engine.control import layout as L
from kvloop.engine.core.sampling import SamplingParams


def kvloop(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "kvloop.engine.cli", *args], check=True, capture_output=True,
                         text=True, timeout=60)
    return out.stdout


def corrupt_from_another_process(path) -> None:
    """Writes a record whose checksum does not match, from a separate process."""
    code = (
        "import sys; from kvloop.engine.control.link import SidecarLink; "
        "from kvloop.engine.control import layout as L; "
        "s = SidecarLink(sys.argv[1]); s.write_targets(3, 0.1); "
        "s.block.mm[L.TARGETS_OFFSET + L.RECORD_HEAD.size + 30] ^= 0x55"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=60)


def test_targets_from_another_process_applied_within_one_step(make_engine, tmp_path):
    path = tmp_path / "control.bin"
    engine = make_engine(control_file=str(path), control_stale_after_s=3.0, max_num_seqs=16)
    engine.add_request("a", [1, 2, 3, 4, 5], SamplingParams(max_tokens=8, ignore_eos=True))
    engine.step()
    shown = json.loads(kvloop("control", "show", "--json", "--control", str(path)))
    assert shown["snapshot"]["start_id"] == engine.control.link.start_id
    assert shown["snapshot"]["num_running"] == 1 and shown["snapshot"]["batch_cap"] == 16

    kvloop("control", "set", "--control", str(path), "--batch-cap", "5", "--watermark", "0.4")
    engine.step()  # one step later the cap is in force
    assert engine.scheduler.knobs.batch_cap == 5 and engine.kv.watermark == 0.4
    assert engine.snapshot().batch_cap == 5

    corrupt_from_another_process(path)
    engine.step()
    assert engine.scheduler.knobs.batch_cap == 5 and engine.kv.watermark == 0.4
    assert engine.control.link.counters["garbled"] == 1

    # the writer goes away: its targets hold until the staleness limit, then the defaults (16) return
    time.sleep(3.2)
    engine.step()
    assert engine.scheduler.knobs.batch_cap == 16 == engine.config.scheduler.max_num_seqs
    assert engine.control.link.counters["stale"] == 1
    engine.drain(max_steps=50)  # the engine kept serving throughout
    engine.step()  # idle steps publish too
    snap = json.loads(kvloop("control", "show", "--json", "--control", str(path)))["snapshot"]
    assert snap["num_running"] == 0 and snap["ttft_p50_s"] is not None and snap["ttft_p50_s"] >= 0


def test_restart_changes_start_id(tmp_path):
    path = tmp_path / "control.bin"
    code = ("import sys; from kvloop.engine.control import ControlLink, Targets; "
            "from kvloop.engine.core.snapshot import EngineSnapshot; "
            "l = ControlLink(sys.argv[1], Targets(8, 0.3)); l.publish(EngineSnapshot()); print(l.start_id)")
    ids = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code, str(path)], check=True, capture_output=True,
                             text=True)
        ids.append(int(out.stdout))
        shown = json.loads(kvloop("control", "show", "--json", "--control", str(path)))
        assert shown["snapshot"]["start_id"] == ids[-1]
    assert ids[0] != ids[1]
    assert path.stat().st_size == L.FILE_SIZE
