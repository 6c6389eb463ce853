"""One step for speed: what Scheduler.schedule(), SimRunner.execute and the step's bookkeeping do, with the
per-row work of steady decode rows done here in one pass, exactly as those would do it.

Near saturation every step admits, prefills and finishes someone, so fast-forward windows (fastforward.py)
rarely apply, and most of a step's time went to calls that change nothing: kv.allocate for a decode row
whose next token fits its last block, and the bookkeeping of a row that only appends a token. Here:
- the running rows are placed as Scheduler._schedule_running places them (in order, each its uncomputed
  tokens within the step's token budget), calling kv.allocate only where it changes something
  (a block to add, a filled block to index, a swap-in); an allocation that fails ends
  this (the scheduler redoes the step and preempts; the allocations made here are then no-ops);
- waiting requests are admitted by the scheduler itself (Scheduler.admit, the second half of schedule());
- the step is priced by the runner (SimRunner.price);
- a decode row that only appends its token (it had its first token, does not finish, no stop tokens) is
  advanced here as bookkeeping.advance would: computed tokens, the token, its time and gap. Every other
  row (prefill chunks, first tokens, finishes) goes through Scheduler.update_from_output, in batch order,
  and the simulator records the step as it records a scheduled one.
Tests check that runs match those with schedule() step by step."""

from __future__ import annotations

from kvloop.engine.scheduler.batch import ScheduledBatch, ScheduledSeq, StepResult
from kvloop.engine.scheduler.bookkeeping import Sampled


class FastStep:
    def __init__(self, sim):
        self.sim = sim

    def place(self) -> ScheduledBatch | None:
        """schedule(): the running rows, then admission. None: an allocation failed (nothing is placed; the
        caller runs schedule(), which preempts)."""
        sim = self.sim
        sched, kv = sim.scheduler, sim.kv
        budget = sched.config.max_num_batched_tokens
        batch = ScheduledBatch()
        decodes, prefills = batch.decodes, batch.prefills
        bs, indexed = kv.block_size, kv.config.prefix_cache
        for seq in sched.running:
            if budget <= 0:
                break
            start = seq.num_computed_tokens
            n = min(len(seq.token_ids) - start, budget)
            table = seq.block_table
            # kv.allocate only where it changes something: a block to add, full blocks to index, a swap-in
            if ((start + n + bs - 1) // bs > len(table)
                    or (indexed and len(seq.block_hashes) < min(start // bs, len(table))) or kv.is_swapped(seq)):
                if not kv.allocate(seq, start + n):
                    return None
            (decodes if n == 1 else prefills).append(ScheduledSeq(seq, start, n))
            budget -= n
        sched.admit(batch, budget, sim.now)
        return batch

    def run(self, batch: ScheduledBatch) -> None:
        """Prices and applies a placed, non-empty batch; the clock advances as in the step loop."""
        sim = self.sim
        cost = sim.runner.price(batch.decodes, batch.prefills)
        sim.now += cost.seconds + sim.charge_moves()
        sim.num_steps += 1
        gaps: dict[float, int] = {}
        sim.record(self.apply(batch.decodes, batch.prefills, sim.now, gaps), gaps)

    def apply(self, decodes: list[ScheduledSeq], prefills: list[ScheduledSeq], now: float,
              gaps: dict[float, int] | None = None) -> list[Sampled]:
        """update_from_output of a step that ran to `now`: a decode row that only appends its token is advanced
        here (as bookkeeping.advance would), the other rows go through update_from_output, in batch order; its
        Sampled come back. With `gaps`, the step's inter-token gaps are counted there, in batch order (as the
        simulator counts them from a whole step's Sampled)."""
        token = self.sim.runner.token
        rest = ScheduledBatch(prefills=prefills)  # what update_from_output applies
        held = rest.decodes
        tokens: dict[str, int] = {}
        for item in decodes:
            seq, start = item.seq, item.start
            toks = seq.token_ids
            if start + 1 != len(toks):  # a prefill's last chunk of one token short of the end: samples nothing
                held.append(item)
                continue
            rid = seq.request_id
            tok = token(rid, start + 1)
            if seq.first_token_time is None:  # its first token
                held.append(item)
                tokens[rid] = tok
                continue
            if gaps is not None:
                gap = now - seq.last_token_time
                gaps[gap] = gaps.get(gap, 0) + 1
            params = seq.params
            if params.stop_token_ids or len(toks) + 1 - len(seq.prompt_token_ids) >= params.max_tokens:
                held.append(item)  # a possible stop token, or its finish
                tokens[rid] = tok
                continue
            seq.num_computed_tokens = start + 1
            toks.append(tok)
            seq.last_token_time = now
        for item in prefills:
            seq = item.seq
            if item.start + item.num_tokens == len(seq.token_ids):
                tokens[seq.request_id] = token(seq.request_id, item.start + item.num_tokens)
                if gaps is not None and seq.first_token_time is not None:
                    gap = now - seq.last_token_time
                    gaps[gap] = gaps.get(gap, 0) + 1
        return self.sim.scheduler.update_from_output(rest, StepResult(tokens), now)
