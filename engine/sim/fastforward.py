"""Coarsening for speed: skip calls to schedule() across steps whose outcome is already known.

When every running sequence is decoding (one uncomputed token, first token already out, none
swapped), all fit the token budget, and no waiting request can be admitted (none waits, or the
batch cap or budget is reached), the next schedule() returns the same decodes again: the only
state it changes is a new block for each sequence whose next token starts a block (allocate,
which also indexes the block just filled; on the window's first step every sequence's allocate runs,
to index what the step before filled). A window of such steps is replayed here by making
exactly those allocate() calls, in the scheduler's order (step by step, oldest sequence first),
with each sequence advanced to the state it would have at that call. The window's last step may be
one at which sequences sample their last token: the last step goes through the scheduler's
bookkeeping (update_from_output) as any step does, which finishes them, and the window ends there
(who can be admitted next has changed). It also ends before the next coordinator/KV sample is due,
before the next arrival unless nobody can be admitted anyway (`admits_nobody`: then arrivals join
the queue inside the window), and at the first allocation that fails (the scheduler then takes over
and preempts as it would). Nothing in the scheduler or KV manager is changed; tests check that
results match step-by-step runs."""

from __future__ import annotations

from kvloop.engine.scheduler.batch import ScheduledSeq
from kvloop.engine.scheduler.sequence import Sequence


def admits_nobody(sched) -> bool:
    """schedule() would admit no waiting request however many wait: static mode with a batch running,
    or the batch cap or the token budget reached. Arrivals then only join the queue, and a window may take
    them in instead of ending at them (near saturation, that is most steps). In codesign, past the cap
    and below its row ceiling, a request that joins a running group may still run: the window ends at an
    arrival that makes `may_admit_past_cap` true."""
    n = len(sched.running)
    if getattr(sched, "static", None) is not None or n >= sched.row_ceiling or n >= sched.config.max_num_batched_tokens:
        return True
    return n >= sched.batch_cap and not sched.may_admit_past_cap()


def eligible(sched, kv) -> bool:
    running = sched.running
    if not running:
        return False
    n = len(running)
    budget = sched.config.max_num_batched_tokens
    if n > budget:
        return False
    static = getattr(sched, "static", None) is not None  # static mode: nobody joins a running batch
    if sched.waiting and not static and n < sched.batch_cap and n < budget:
        return False  # the scheduler would try to admit from the queue
    if n < budget and sched.may_admit_past_cap():
        return False  # codesign: a waiting request joins a running group and may run past the cap
    for seq in running:
        if seq.num_tokens - seq.num_computed_tokens != 1 or seq.first_token_time is None or kv.is_swapped(seq):
            return False
        if seq.params.stop_token_ids:  # finishes are decided at a window's last step only: max_tokens alone
            return False
    return True


class Window:
    """Plans and applies one window; `run` returns (steps, seconds) actually advanced."""

    def __init__(self, sim):
        self.sim = sim

    def run(self, deadline: float, take_arrivals: bool = False) -> tuple[int, float]:
        """Steps until `deadline` (or a finish, or a failed allocation). With `take_arrivals`, requests
        due before a step are added to the queue at that step's start, as the main loop would."""
        sim = self.sim
        heap = sim._heap
        running: list[Sequence] = list(sim.scheduler.running)
        n = len(running)
        cost, bs = sim.runner.cost, sim.kv.block_size
        # Up to the step at which the first sequence samples its last token (it finishes after it).
        max_steps = min(s.params.max_tokens - s.num_output_tokens for s in running)
        base = [s.num_computed_tokens for s in running]
        # The decode set and its shared prefixes hold for the window (new blocks are private): so does the
        # runner's cascade plan, and each step is priced with its groups as a scheduled step would be.
        groups = sim.runner.groups(running, base)
        decode = sim.runner.decode
        # Block crossings: sequence i needs a new block at the 0-based steps j where its
        # num_computed at the step's start is a block multiple.
        crossings: dict[int, list[int]] = {}
        for i, c in enumerate(base):
            for j in range((-c) % bs, max_steps, bs):
                crossings.setdefault(j, []).append(i)
        times: list[float] = []
        t = start = sim.now
        done = 0
        for j in range(max_steps):
            if t >= deadline:  # step j may start only while nothing else is due
                break
            took = False
            while take_arrivals and heap and heap[0][0] <= t:
                sim.now = t
                sim.arrive_next()
                took = True
            if took and sim.scheduler.may_admit_past_cap():
                break  # an arrival joins a running group past the cap: the scheduler decides step j
            failed = False
            # ascending i: the scheduler's order within a step. The first step allocates for everyone,
            # as schedule() would: that also commits blocks the last step filled (and shares a block
            # another sequence indexed meanwhile); later, blocks fill exactly at the crossings.
            for i in range(n) if j == 0 else crossings.get(j, ()):
                seq = running[i]
                self._advance(seq, base[i] + j)
                if not sim.kv.allocate(seq, base[i] + j + 1):
                    failed = True  # the scheduler redoes step j itself (and preempts)
                    break
            if failed:
                break
            decode_us = decode.decode_us([c + j + 1 for c in base], groups)
            dt = cost.step(n, n, n, 0.0, 0.0, decode_us=decode_us).seconds + sim.charge_moves()
            times.append(dt)
            t += dt
            done = j + 1
        elapsed = sum(times[:done])
        now = start  # sim.now moved to the arrivals taken in on the way
        for dt in times[:done]:
            now += dt
            sim.rec.itl.add(dt, n)
        sim.runner.busy_s += elapsed
        sim.runner.steps += done
        sim.num_steps += done
        sim.now = now
        if done:
            self._last_step(running, base, done - 1, now)
        return done, elapsed

    def _last_step(self, running: list[Sequence], base: list[int], j: int, now: float) -> None:
        """Applies the window's last step (j) as the step loop would: each sequence is brought to that
        step's start, then the step's bookkeeping (FastStep.apply: update_from_output for the rows that
        finish) advances it, appends its token, stamps the time and finishes those that reached max_tokens
        (only possible when j is the window's planned last)."""
        sim = self.sim
        decodes = []
        for i, seq in enumerate(running):
            start = base[i] + j
            del seq.token_ids[start + 1 :]  # allocations for a step that then failed ran one token ahead
            self._advance(seq, start)
            decodes.append(ScheduledSeq(seq, start, 1))
        for sampled in sim.fast_step.apply(decodes, [], now):
            if sampled.finish_reason is not None:
                sim.finished(sampled.seq)

    def _advance(self, seq: Sequence, computed: int) -> None:
        """Brings seq to `computed` tokens computed, with the token sampled at the last step appended."""
        toks = seq.token_ids
        if len(toks) <= computed:
            token, rid = self.sim.runner.token, seq.request_id
            toks += [token(rid, p) for p in range(len(toks), computed + 1)]
        seq.num_computed_tokens = computed
