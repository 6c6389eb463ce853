"""Pure-Python helpers: a fake clock, a fake runner step (the engine's bookkeeping), request builders."""

from __future__ import annotations

import random

from kvloop.engine.core.batch import StepResult
from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.core.sequence import Sequence
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.kv.manager import KVCacheManager
from kvloop.engine.scheduler.scheduler import Scheduler, SchedulerConfig


class FakeClock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def kv_config(mode: str = "codesign", **kw) -> KVConfig:
    """Small-pool settings: every block passes the gate, short prefixes count, no lower tiers by default."""
    base = {"admit_min_requests": 1, "min_prefix_tokens": 4, "host_cache_tokens": 0, "watermark": 0.25}
    return KVConfig(mode=mode, **{**base, **kw})


def make(num_blocks: int = 64, block_size: int = 4, kv: KVConfig | None = None,
         clock: FakeClock | None = None,
         **cfg) -> Scheduler:
    cfg.setdefault("max_num_batched_tokens", 4096)
    return Scheduler(SchedulerConfig(**cfg), KVCacheManager(num_blocks, block_size, kv), clock=clock)


def req(rid: str, prompt: list[int], max_tokens: int = 4) -> Sequence:
    return Sequence(rid, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))


def toks(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(n)]


def next_token(seq: Sequence) -> int:
    """A deterministic 'model': the next token depends on the whole context only."""
    return hash(tuple(seq.token_ids)) % 30000 + 100


def step(s: Scheduler) -> list[Sequence]:
    """One engine step without a model; returns the sequences finished (length) this step."""
    batch = s.schedule()
    assert all(item.start == item.seq.num_computed_tokens for item in batch.items)
    result = StepResult({item.seq.request_id: next_token(item.seq) for item in batch.items if item.samples})
    return [x.seq for x in s.update_from_output(batch, result) if x.finish_reason == "length"]


def run_all(s: Scheduler, max_steps: int = 5000, clock: FakeClock | None = None, dt: float = 0.01) -> int:
    """Steps until no work is left (integrity checked every step); returns the steps taken."""
    for n in range(max_steps):
        if not s.has_work():
            return n
        step(s)
        s.check_integrity()
        if clock is not None:
            clock.t += dt
    raise AssertionError(f"work left after {max_steps} steps: {len(s.waiting)} waiting, {len(s.running)} "
                         "running")
