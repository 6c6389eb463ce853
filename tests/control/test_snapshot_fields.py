"""Every field of the control block that the sidecar reads moves during a run that exercises it.

Real engines over the embedded model publish through the control block; the sidecar's own coordinator
reads it (SidecarLink, PeriodWindow, the law's observation), and a spy on the record notes every field
it reads and the values it saw. The run: prefix hits from the device, then (after pressure evicts the
document) from the host, preemptions, a queue, a rejection; a restarted engine over the same disk
directory hits the disk; a static-mode engine has an out-of-memory event. A field the sidecar reads that
stayed constant (as four of them once did, always 0) fails the test."""

from __future__ import annotations

import random

import pytest

from kvloop.engine.config import EngineConfig
from kvloop.engine.control.link import SidecarLink
from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.engine_core import EngineCore
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.scheduler.scheduler import RequestRejected, SchedulerConfig
from kvloop.sidecar.coordinator import Coordinator
from kvloop.sidecar.settings import SettingsWatcher

N = 4  # tokens generated per request


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(n)]


DOC = tokens(1, 64)  # four blocks: a reusable prefix (min_prefix_tokens is 16 here)


class Spy:
    """Stands in for a control record; notes each field read and the value it had."""

    def __init__(self, record, seen: dict[str, set[str]]):
        self._record, self._seen = record, seen

    def __getattr__(self, name: str):
        value = getattr(self._record, name)
        self._seen.setdefault(name, set()).add(repr(value))  # repr: NaN equals NaN here
        return value


class Run:
    def __init__(self, path, make, coord: Coordinator):
        self.path, self.make, self.coord = path, make, coord
        self.engine: EngineCore | None = None
        self.finished: dict[str, int] = {}  # request id -> output tokens
        self.n = 0

    def start(self, **config) -> EngineCore:
        if self.engine is not None:
            self.engine.kv.flush()
            self.engine.control.close()  # the old engine is gone: release its mapping of the block
        self.engine = self.make(self.path, **config)
        self.steps(1)  # the first publish of this start
        return self.engine

    def add(self, prompt: list[int], max_tokens: int = N) -> None:
        self.n += 1
        self.engine.add_request(f"r{self.n}", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))

    def steps(self, n: int) -> None:
        for _ in range(n):
            for out in self.engine.step():
                if out.finished:
                    self.finished[out.request_id] = out.num_output_tokens
            self.coord.sample()

    def drain(self) -> None:
        ticks = 0
        while self.engine.has_unfinished():
            self.steps(2)
            ticks += 1
            if ticks % 3 == 0:
                self.coord.tick()
        self.steps(1)
        self.coord.tick()


@pytest.fixture()
def make(checkpoint, fp32_model, tokenizer, tmp_path):
    def build(path, mode: str = "codesign", kv_cache_tokens: int = 256, sched: dict | None = None,
              block_size: int = 16, **kv) -> EngineCore:
        cfg = EngineConfig(dtype="float32", progress=False, kv_cache_tokens=kv_cache_tokens,
                           control_file=str(path),
                           block_size=block_size,
                           # chunked prefills even while nothing decodes: prompt blocks pending show
                           scheduler=SchedulerConfig(**{"max_num_batched_tokens": 256, "idle_step_tokens": 0,
                                                        **(sched or {})}),
                           kv=KVConfig(**{"disk_dir": str(tmp_path / "disk"), **kv}), mode=mode)
        return EngineCore(cfg, model=fp32_model, tokenizer=tokenizer, fingerprint=checkpoint.fingerprint,
                          model_name=checkpoint.name)

    return build


def test_every_field_the_sidecar_reads_moves(make, tmp_path, monkeypatch):
    seen: dict[str, set[str]] = {}
    read = SidecarLink.read_snapshot
    monkeypatch.setattr(SidecarLink, "read_snapshot", lambda self: (r := read(self)) and Spy(r, seen))
    path = tmp_path / "control.bin"
    coord = Coordinator(SettingsWatcher(None, {"mode": "observe", "snapshot_stale_s": 600.0}),
                        control_path=str(path))
    run = Run(path, make, coord)
    codesign = dict(admit_min_requests=1, disk_admit_min_requests=1, min_prefix_tokens=16, watermark=0.0,
                    host_cache_tokens=512)

    engine = run.start(sched=dict(max_num_seqs=5, decode_reserve_tokens=0), **codesign)
    run.add(DOC + tokens(10, 8))
    run.drain()
    run.add(DOC + tokens(11, 8))  # the document from the device
    run.drain()
    with pytest.raises(RequestRejected):
        run.add(tokens(12, 300))  # longer than the pool: refused at the door
    for i in range(6):  # more than the cap (a queue) growing past the pool (preemptions), evicting DOC
        run.add(tokens(20 + i, 47), max_tokens=12)
    run.drain()
    run.add(DOC + tokens(13, 8))  # the document back from the host tier
    run.drain()
    hits = engine.snapshot()
    assert hits.prefix_hits("device") and hits.prefix_hits("host") and hits.num_preemptions

    # no request meets a 1 ns TTFT: the SLO's ttft misses move; the static engine's 1 ns TPOT: its tpot ones
    restarted = run.start(sched=dict(max_num_seqs=3, max_num_batched_tokens=128, max_model_len=4096,
                                     slo_ttft_s=1e-9),
                          # same disk directory; another budget and max context
                          **{**codesign, "watermark": 0.1})
    run.add(DOC + tokens(14, 8))  # the document from the disk tier
    run.drain()
    # one lookup of 72 tokens: the device and the host (empty) served none of them
    after = restarted.snapshot()
    assert [after.prefix_queries(t) for t in ("device", "host", "disk")] == [len(DOC) + 8] * 3
    assert [after.prefix_hits(t) for t in ("device", "host", "disk")] == [0, 0, len(DOC)]
    run.add(tokens(15, 200))  # longer than the step budget (128): its prompt's rest is pending after a step
    run.drain()

    static = run.start(mode="static", kv_cache_tokens=128, block_size=32,
                       sched=dict(static_batch_size=3, static_fill_timeout_s=0.0, slo_ttft_s=600.0,
                                  slo_tpot_s=1e-9), host_cache_tokens=0)
    for i in range(3):  # three reservations of two blocks in a pool of four: one does not fit
        run.add(tokens(30 + i, 50), max_tokens=8)
    run.drain()
    assert static.snapshot().num_oom_events == 1
    static.control.close()

    last = read(SidecarLink(path))  # (not through the spy) the static engine's own counters
    assert last.requests_finished == 3 and last.tokens_generated == 16  # two ran 8 tokens, one failed at once
    assert len(run.finished) == run.n - 1  # every request but the rejected one finished

    dead = {"requests_finished", "tokens_generated", "prefix_queries_host", "prefix_queries_disk"}
    assert dead <= set(seen), "the sidecar no longer reads these fields"
    constant = {name: values for name, values in seen.items() if len(values) < 2}
    assert not constant, f"fields the sidecar reads stayed constant through the run: {constant}"
