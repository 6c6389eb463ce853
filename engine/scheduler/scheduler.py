"""Continuous batching with a token budget and chunked prefill, running requests first (pure Python).

Each step: running sequences get their next token (or their next prefill chunk) oldest first; when the
pool cannot hold that growth, the newest running sequence is preempted (swapped to the host tier when
there is room, else freed and recomputed later) instead of failing. Then waiting sequences are admitted
while the batch cap, the token budget and memory allow, as the policy (policy.py, named by `mode`) says:
- FCFS admission (continuous, continuous+lru): in arrival order; the head waits for memory.
- grouped admission (codesign): in prefix-grouping order with aging (grouping.py), or with queue_order work
  by remaining uncached work under an adaptive aging bound (ordering.py), each through the
  cache-aware admission gate (admission.py). Requests that join a running group's shared prefix come
  first (they add only their suffix to a decode step's reads). The batch cap counts plain rows: past it, a
  request is admitted while the step's decode attention with it, priced by the step-cost function shared with
  the simulator (step_cost.py), stays within what `batch_cap` plain rows would cost; the room running
  groups save and a joiner's small price are what let it in. At most cascade_cap_factor x the cap.
- static batching (static): fixed batches instead of admission (static.py).
With a TPOT target (tpot_gate.py), admission also waits while the measured decode steps are slower than it.

Time comes from `clock` (default time.monotonic; the simulator passes its virtual clock): aging and the
static fill timeout run on it."""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Collection

from kvloop.engine.cascade.cost import AttentionCost, cost_for
from kvloop.engine.cascade.plan import CascadePlanner
from kvloop.engine.cascade.step_cost import StepCost
from kvloop.engine.core.batch import ScheduledBatch, StepResult
from kvloop.engine.core.knobs import Knobs
from kvloop.engine.core.policy import resolve_policy
from kvloop.engine.core.sequence import SeqStatus, Sequence, decodes
from kvloop.engine.kv.manager import KVCacheManager, blocks_for
from kvloop.engine.scheduler.admission import AdmissionGate
from kvloop.engine.scheduler.admission_entry import admission_shut, admission_tried
from kvloop.engine.scheduler.bookkeeping import Sampled, advance
from kvloop.engine.scheduler.config import RequestRejected, SchedulerConfig, resolve_cascade_groups
from kvloop.engine.scheduler.grouping import order_waiting
from kvloop.engine.scheduler.ordering import WaitReference, order_by_work
from kvloop.engine.scheduler.preemption import Preemptor
from kvloop.engine.scheduler.prefix import PrefixHit, PrefixView
from kvloop.engine.scheduler.running import place, schedule_running
from kvloop.engine.scheduler.slo_ledger import SloLedger
from kvloop.engine.scheduler.speculation import Speculator
from kvloop.engine.scheduler.static import StaticBatcher
from kvloop.engine.scheduler.tpot_gate import TpotGate

__all__ = ["RequestRejected", "Scheduler", "SchedulerConfig"]


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, clock: Callable[[], float] | None = None,
                 attention: AttentionCost | None = None, layers: int = 1):
        """attention: the runner's per-layer decode attention model (the engine sets it from its KV dtype
        with set_attention_cost; bf16's until then); layers: the model's (the simulator prices with it)."""
        self.config = config
        self.kv = kv
        self.clock = clock or time.monotonic
        self.policy = resolve_policy(config.mode, kv.config.mode)
        self.mode = self.policy.name  # the user-facing name (metrics label, snapshot)
        self.step_cost = StepCost(attention or cost_for("bfloat16"), layers, kv.block_size,
                                  resolve_cascade_groups(config.cascade_groups, self.mode))
        self._planner: CascadePlanner | None = None  # prices past the cap (the runner keeps its own)
        self._stints = itertools.count(1)  # Sequence.stint of each start
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.view = PrefixView(kv)
        self.gate = AdmissionGate(kv, self.view, config.decode_reserve_tokens)
        self.tpot_gate = TpotGate(config.tpot_target_ms)
        self.preemptor = Preemptor(kv)
        self.static = (StaticBatcher(config.static_batch_size, config.static_fill_timeout_s,
                                     config.static_oom)
                       if self.policy.static_batching else None)
        self.rejections: dict[str, int] = {}
        # finished by the scheduler itself (static OOM); the engine reports them
        self.failed: list[Sequence] = []
        self._enqueued: dict[Sequence, float] = {}
        self.waits = WaitReference()  # recent queue waits: the aging bound of queue_order work
        self.requests_finished = 0  # finish() of any reason; for the engine snapshot
        self.tokens_generated = 0  # output tokens of the finished requests
        self.slo_ledger = SloLedger(config.slo)
        # the live knobs, starting at the configured values; the KV manager reads the watermark from the same
        self.knobs = Knobs(config.max_num_seqs, kv.config.watermark, config.max_num_batched_tokens,
                           kv.block_size, config.speculation_max_tokens)
        kv.knobs = self.knobs
        # prompt-lookup speculation (the engine sets its exactness bound from the model's linears)
        self.speculator = Speculator(config.speculation, self.knobs)

    # ---- knobs and counters ---------------------------------------------------------------------
    @property
    def batch_cap(self) -> int:
        return self.static.batch_size if self.static else self.knobs.batch_cap

    def set_batch_cap(self, n: int) -> None:
        """Lowering the cap preempts nobody: admission waits."""
        self.knobs.set(batch_cap=n)

    @property
    def step_token_budget(self) -> int:
        return self.knobs.step_token_budget

    @property
    def step_token_budget_max(self) -> int:
        return self.knobs.budget_ceiling

    def set_step_token_budget(self, n: int) -> None:
        """Clamped to [the block size, at least 16; the configured budget] (core/knobs.py)."""
        self.knobs.set(step_token_budget=n)

    @property
    def row_ceiling(self) -> int:
        """Running rows at most: the cap, or under grouped admission the cap stretched for rows that join a
        group."""
        if not self.policy.groups_prefixes:
            return self.batch_cap
        return max(self.batch_cap, math.floor(self.batch_cap * self.config.cascade_cap_factor))

    def set_attention_cost(self, attention: AttentionCost) -> None:
        self.step_cost = dataclasses.replace(self.step_cost, attention=attention)
        self._planner = None  # its plans were priced with the old model

    @property
    def num_preemptions(self) -> int:
        return self.preemptor.total

    @property
    def preemptions_by_kind(self) -> dict[str, int]:
        return dict(self.preemptor.counts)

    @property
    def num_rejections(self) -> int:
        return sum(self.rejections.values())

    @property
    def num_oom_events(self) -> int:
        return self.static.oom_events if self.static else 0

    def enqueued(self, seq: Sequence) -> float:
        """When seq (last) entered the waiting queue, on the scheduler's clock."""
        return self._enqueued.get(seq, seq.arrival_time)

    # ---- requests -------------------------------------------------------------------------------
    def _reject(self, reason: str, message: str) -> None:
        self.rejections[reason] = self.rejections.get(reason, 0) + 1
        raise RequestRejected(reason, message)

    def add(self, seq: Sequence) -> None:
        max_tokens = 0 if seq.params is None else seq.params.max_tokens
        total = seq.num_prompt_tokens + max_tokens
        if seq.num_prompt_tokens == 0:
            self._reject("empty_prompt", "the prompt is empty")
        if total > self.config.max_model_len:
            self._reject("too_long",
                         f"this model's maximum context length is {self.config.max_model_len} tokens; the "
                         f"request has {seq.num_prompt_tokens} prompt tokens and asks for {max_tokens} more "
                         f"({total} in all)")
        # Must fit the pool alone at its full length, or it could never finish (preempting itself forever).
        if blocks_for(total, self.kv.block_size) > self.kv.num_blocks:
            self._reject("too_long",
                         f"the request ({seq.num_prompt_tokens} prompt + {max_tokens} output tokens) "
                         f"does not fit the KV cache ({self.kv.num_blocks * self.kv.block_size} tokens)")
        if len(self.waiting) >= self.config.max_waiting:
            self._reject("queue_full", f"{len(self.waiting)} requests are waiting (the bound is "
                         f"{self.config.max_waiting}); retry later")
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)
        self._enqueued[seq] = self.clock()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def take_failed(self) -> list[Sequence]:
        out, self.failed = self.failed, []
        return out

    # ---- the step -------------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        now = self.clock()
        batch = ScheduledBatch()
        if self.static is not None:
            self.static.form(self, now)
        step_budget = self.step_budget(lambda: any(map(decodes, self.running)))
        budget = schedule_running(self, batch, step_budget)
        self.admit(batch, budget, now)
        if self.speculator.active and batch.decodes:
            # proposals last: they take only the budget and free blocks that running and admitted rows left
            # one more decode row's attention over the model's layers (the step-cost model: step_cost.py)
            per_layer = self.step_cost.attention.plain_us
            layers = self.speculator.model_layers
            self.speculator.assign(batch, step_budget - batch.num_tokens, self.kv, bool(self.waiting),
                                   lambda context: layers * per_layer([context]))
        return batch

    def step_budget(self, decoding: Callable[[], bool]) -> int:
        """Tokens this step may carry: the budget, or while no running row decodes (`decoding()`, asked only
        where the idle budget is larger) the idle budget. The simulator's fast step asks the same."""
        budget, idle = self.knobs.step_token_budget, self.config.idle_step_tokens
        if idle <= budget or self.static is not None or decoding():
            return budget
        return idle

    def admit(self, batch: ScheduledBatch, budget: int, now: float) -> None:
        """schedule()'s second half: waiting requests join the batch within what the running rows left of the
        token budget (the simulator's fast step places the running rows itself, then calls this)."""
        # the TPOT gate is asked again per request (an idle engine takes one)
        if admission_tried(self, budget) and self.tpot_gate.open(len(self.running)):
            if self.policy.groups_prefixes:
                self._admit_grouped(batch, budget, now)
            else:
                self._admit_fcfs(batch, budget, now)

    def _admit_fcfs(self, batch: ScheduledBatch, budget: int, now: float) -> None:
        while admission_tried(self, budget) and self.tpot_gate.open(len(self.running)):
            n = self._try_start(self.waiting[0], budget, now)
            if not n:
                break  # FCFS: the head of the queue waits for memory
            place(batch, self.running[-1], n)
            budget -= n

    def _admit_grouped(self, batch: ScheduledBatch, budget: int, now: float) -> None:
        # each candidate's peek orders, prices and gates it: one walk of its prefix
        with self.view.remembered():
            self._admit_grouped_peeking(batch, budget, now)

    def _admit_grouped_peeking(self, batch: ScheduledBatch, budget: int, now: float) -> None:
        cfg = self.config
        min_share = max(1, self.kv.config.min_prefix_tokens // self.kv.block_size)
        if cfg.queue_order in ("work", "slo"):
            aged_after = self.waits.aged_after(cfg.aging_factor, cfg.aging_floor_s)
            order, priority = order_by_work(self.waiting, self.running, self.view, now, self.enqueued,
                                            aged_after, cfg.grouping_max_queue, min_share, self.kv.block_size,
                                            self.join_saving_us,
                                            self._ttft_deadline if cfg.queue_order == "slo" else None)
        else:
            order, priority = order_waiting(self.waiting, self.running, self.view, now, self.enqueued,
                                            cfg.aging_s, cfg.grouping_max_queue, min_share,
                                            self.join_saving_us)
        headroom = self.gate.headroom(self.running)
        past_cap: list[float] | None = None  # [priced step, its budget] once the cap is reached
        for seq in order:
            if admission_shut(self, budget) or not self.tpot_gate.open(len(self.running)):
                return
            extra = 0.0
            if len(self.running) >= self.batch_cap:
                past_cap = past_cap or self._step_price()
                extra = self._added_price(seq)
                if past_cap[0] + extra > past_cap[1]:
                    if id(seq) in priority:
                        return  # an aged or preempted request waits for room: nobody passes it
                    continue
            need = self.gate.need(seq)
            # A lone request always gets its chance (progress); otherwise the gate decides.
            n = 0
            if need <= headroom or not self.running:
                n = self._try_start(seq, budget, now)
                self.view.forget()  # it changed the cache (attached, allocated, or gave back)
            if not n:
                if id(seq) in priority:
                    return  # hold memory for a request that has waited its bound (or was preempted)
                continue
            if past_cap is not None:
                past_cap[0] += extra
            headroom -= need
            place(batch, seq, n)
            budget -= n

    def _ttft_deadline(self, seq: Sequence) -> float:
        """When seq's TTFT bound under the SLO runs out, on the scheduler's clock."""
        return seq.arrival_time + self.slo_ledger.slo.ttft_bound(seq.num_prompt_tokens)

    # ---- the step-cost function in grouped admission ------------------------------------------------
    def join_saving_us(self, hit: PrefixHit) -> float:
        """Decode attention saved per step by a request with this hit joining the running rows that hold
        its shared prefix (0 when that group would not cascade)."""
        return self.step_cost.join_saving_us(hit.sharers, hit.shared * self.kv.block_size)

    def _step_price(self) -> list[float]:
        """[the running rows' decode step as the runner would run it, the budget past the cap: what
        batch_cap plain rows of their mean context cost]. Prefilling rows count as far as allocated; the
        plan is reused while the rows (and the prefilling ones' lengths) are unchanged."""
        bs = self.kv.block_size
        rows = [s for s in self.running if s.block_table]
        ctx = [min(len(s.token_ids), len(s.block_table) * bs) for s in rows]
        # a row's identity: its stint (an int: cheap to hash, as the planner does for every row), with its
        # context while it prefills (a prefilling row that grew is planned anew)
        key = tuple((s.stint, c) if s.num_computed_tokens < len(s.prompt_token_ids) else s.stint
                    for s, c in zip(rows, ctx, strict=True))
        sc = self.step_cost
        if self._planner is None:
            self._planner = sc.planner()
        # a row's committed (indexed) blocks stay while it runs: the planner compares only the others
        tables, committed = [s.block_table for s in rows], [len(s.block_hashes) for s in rows]
        groups = self._planner.shapes(key, tables, ctx, committed)
        return [sc.decode_us(ctx, groups), sc.decode_us(ctx) * self.batch_cap / max(1, len(ctx))]

    def _added_price(self, seq: Sequence) -> float:
        """What seq adds to a decode step: its plain row, less what joining a running group saves."""
        hit = self.view.peek(seq)
        saving = self.join_saving_us(hit) if hit.shared else 0.0
        return self.step_cost.decode_us([seq.num_tokens]) - saving

    def may_admit_past_cap(self) -> bool:
        """Whether schedule() might admit a waiting request beyond the batch cap: grouped admission, someone
        waiting, below the row ceiling (the priced budget moves with every step's contexts, so this does not
        try to predict it)."""
        return self.policy.groups_prefixes and bool(self.waiting) and len(self.running) < self.row_ceiling

    def _try_start(self, seq: Sequence, budget: int, now: float) -> int:
        """Attaches seq's cached prefix (or swaps it in) and allocates its first chunk; on success seq runs.
        Returns the chunk's tokens; 0 when memory is short, and then seq holds no device blocks: a waiting
        request that kept blocks could starve the running ones (or, with none running, deadlock)."""
        kv = self.kv
        was_swapped = kv.is_swapped(seq)
        if seq.num_computed_tokens == 0 and not seq.block_table and not was_swapped:
            kv.lookup_prefix(seq)
        n = min(seq.num_uncomputed_tokens, budget)
        if kv.allocate(seq, seq.num_computed_tokens + n):
            self.waiting.remove(seq)
            self.start_running(seq, now)
            return n
        if seq.block_table and not (was_swapped and kv.swap_out(seq)):  # swapped in, then short: back out
            kv.release(seq)
            seq.num_computed_tokens = seq.num_cached_tokens = 0
            seq.cached_tokens_by_tier = {}
        return 0

    def start_running(self, seq: Sequence, now: float) -> None:
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = now
            self.waits.record(now - self.enqueued(seq))
        self._enqueued.pop(seq, None)
        seq.status = SeqStatus.RUNNING
        seq.stint = next(self._stints)
        self.running.append(seq)

    def preempt(self, seq: Sequence) -> str:
        """Swap (host room) or recompute; seq goes back to the head of the queue. Returns the kind."""
        self.running.remove(seq)
        kind = self.preemptor.preempt(seq)
        self.waiting.appendleft(seq)
        self._enqueued[seq] = self.clock()
        return kind

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.is_finished:
            return
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._enqueued.pop(seq, None)
        self.kv.release(seq)
        self.speculator.forget(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        seq.finished_time = self.clock()
        self.requests_finished += 1
        self.tokens_generated += seq.num_output_tokens
        self.slo_ledger.record(seq, reason, seq.finished_time)

    def fail(self, seq: Sequence, error: str) -> None:
        """Finishes seq with finish_reason 'error' and hands it to the engine to report."""
        self.finish(seq, "error")
        seq.error = error
        self.failed.append(seq)

    def check_integrity(self) -> None:
        self.kv.check_integrity([*self.running, *self.waiting])

    # ---- after the step -------------------------------------------------------------------------
    def observe_step(self, seconds: float, decoded: bool) -> None:
        """How long a step took (the engine's wall time, the simulator's virtual time); `decoded`: rows
        sampled a next token in it (its length is their time per output token, which the TPOT gate holds)."""
        if decoded:
            self.tpot_gate.observe(seconds)
            self.speculator.observe_step(seconds)

    def update_from_output(self, batch: ScheduledBatch, result: StepResult, now: float | None = None,
                           eos_token_ids: Collection[int] = ()) -> list[Sampled]:
        """The step's bookkeeping (bookkeeping.py), item by item in the batch's order: computed tokens,
        sampled tokens, token times (`now`, else the clock), and the finishes it decides (stop token,
        length, a request the runner failed), released here. Returns the sequences that sampled, for the
        caller's own records (outputs, stop strings, latency metrics)."""
        now = self.clock() if now is None else now
        sampled = []
        for item in batch.items:
            s = advance(item, result, now, eos_token_ids)
            if s is None:
                continue
            if item.draft:  # before a finish: a finished row's acceptance is forgotten
                self.speculator.settle(item, s.tokens, self.kv)
            if s.finish_reason is not None:
                self.finish(s.seq, s.finish_reason)
            sampled.append(s)
        return sampled
