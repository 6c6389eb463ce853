"""Fast-forward: the simulator's steps without schedule()'s per-row calls, exactly as the step loop would run
them, with steady decode rows advanced lazily (lazy_rows.py: a row's Sequence is written only where
something reads it). Every decision is the scheduler's own rule, asked rather than copied: the budget's split
over the running rows and when a row's step needs the KV manager (scheduler/running.py), whether admission
weighs the queue (scheduler/admission_entry.py), the step budget (Scheduler.step_budget), admission itself
(Scheduler.admit) and the bookkeeping (Scheduler.update_from_output). At every step boundary it decides as the
step loop decides:

- a window, where every running row is steady and admit() would not weigh the queue (`window_opens`): the
  next schedule() would return the same decodes again, and the only state it changes is a new block for a row
  whose next token starts one (allocate, which also indexes the block just filled). Such steps are replayed
  with exactly those allocate() calls, in the scheduler's order, up to the step in which a row samples its
  last token: that step goes through the scheduler's bookkeeping (update_from_output), which finishes it.
  A window also ends before the next coordinator/KV sample is due, before the next arrival unless admission
  is shut whoever waits (`admission_shut`: then arrivals join the queue inside the window), and at the first
  allocation that fails. Its steps are accounted as windows always were: inter-token gaps of (step time,
  rows) per step, the runner's busy time summed at its end.
- otherwise one step, as schedule(), SimRunner.execute and the simulator's bookkeeping make it: the running
  rows given the scheduler's split of the token budget (kv.allocate only where it changes something), waiting
  requests admitted by the scheduler itself (Scheduler.admit, after every row is written when the admission
  reads them all: grouped admission), the step priced by the runner's cost model and plan, and the bookkeeping
  of the rows that need it (first tokens, prefill chunks, finishes) through update_from_output, in batch
  order; a steady row only advances.
It hands back to the step loop (every row written) where the loop has more to do than step: a sample or a
coordinator decision due, the end, nothing to run (idle), or a step only schedule() can take: an allocation
that fails (schedule() preempts), a steady row the token budget does not reach, static batching. Nothing in
the scheduler or KV manager is changed; tests check that results match step-by-step runs."""

from __future__ import annotations

import math
from bisect import bisect_left
from itertools import repeat
from operator import add, itemgetter

from kvloop.engine.core.batch import ScheduledBatch, ScheduledSeq, StepResult
from kvloop.engine.core.sequence import decodes
from kvloop.engine.scheduler.admission_entry import admission_shut, admission_tried
from kvloop.engine.scheduler.running import holds, place, split_budget
from kvloop.engine.scheduler.scheduler import Scheduler
from kvloop.engine.sim.lazy_rows import LazyRows, Steady

CONTINUE, SCHEDULE, IDLE = "continue", "schedule", "idle"  # what the step loop does next (FastForward.run)


def _all_decode() -> bool:
    return True


def decode_left(sched: Scheduler) -> int:
    """The token budget that a step of the running rows, each decoding one token, leaves for admission."""
    return sched.step_budget(_all_decode) - len(sched.running)


def window_opens(sched: Scheduler) -> bool:
    """A window may start (given every running row is steady): rows run, the budget reaches them all, and
    admit() would not weigh the queue."""
    left = decode_left(sched)
    return bool(sched.running) and left >= 0 and not admission_tried(sched, left)


class FastForward:
    def __init__(self, sim, steps: bool = True):
        self.sim = sim
        self.steps = steps  # False: windows only (other steps through schedule())
        self.rows = LazyRows(sim.kv, sim.runner.token)
        self._order: list = []  # the decode rows of the last step (steady ones in running order)
        self._bases: list[int] = []  # their contexts at step j are base + j
        self._groups: list[tuple[int, int]] = []  # their plan's group shapes
        self._stale = True  # _order needs rebuilding (it held single-token rows that are not steady)

    def run(self) -> str:
        """Steps from this boundary (arrivals taken, observations made, work to do) while it can."""
        sim, rows = self.sim, self.rows
        sched, heap = sim.scheduler, sim._heap
        rows.reset(sched.running)
        self._stale = True
        while True:
            done = self._window() if not rows.others and window_opens(sched) else 0
            if done is None:
                return self._exit(SCHEDULE)
            if not done:
                if not self.steps or sched.static is not None:
                    return self._exit(SCHEDULE)
                ran = self._step()
                if ran != CONTINUE:
                    return ran
            # the next boundary, as the step loop comes to it
            # until_s read live: a fleet (fleet.py) lowers it while this runs
            if sim.now >= (sim.config.until_s if sim.config.until_s is not None else math.inf):
                return self._exit(CONTINUE)
            while heap and heap[0][0] <= sim.now:
                sim.arrive_next()
            coord = sim.coord
            if sim.now >= sim._next_sample or (coord is not None and coord.next_event() <= sim.now):
                return self._exit(CONTINUE)
            if not sched.has_work():
                return CONTINUE

    def _exit(self, then: str) -> str:
        self.rows.materialize_all(self.rows.j, self.sim.now)
        return then

    # ---- the decode rows' order, contexts and plan --------------------------------------------------------
    def _decode_rows(self, singles: dict) -> None:
        """The decode rows' order, contexts less j, and plan, where they changed: the steady rows (kept in
        running order by LazyRows), with `singles` (row -> start: single-token rows that are
        not steady) among them."""
        rows, j = self.rows, self.rows.j
        if not (rows.changed or self._stale or singles):
            return
        # each put in its place by rank (ranks are distinct): a copy of the steady rows, not a sort
        if singles:
            order, bases, ranks = rows.order[:], rows.bases[:], rows.ranks[:]
            for s, start in singles.items():
                r = rows.rank[s]
                at = bisect_left(ranks, r)
                ranks.insert(at, r)
                order.insert(at, s)
                bases.insert(at, start + 1 - j)
            self._order, self._bases = order, bases
        else:
            self._order, self._bases = rows.order, rows.bases
        self._groups = self.sim.runner.plan_rows(self._order, self._contexts(j))
        rows.changed = False
        self._stale = bool(singles)

    def _contexts(self, j: int) -> list[int]:
        """The decode rows' contexts at step j (base + j each, in C: every step of every row)."""
        return list(map(add, self._bases, repeat(j)))

    # ---- windows
    # --------------------------------------------------------------------------------------------
    def _window(self) -> int | None:
        """One window from this boundary; returns its steps (0: none could run, the step mode takes this one),
        None where an allocation failed (schedule() takes the step and preempts)."""
        sim, rows = self.sim, self.rows
        sched, kv, runner, heap = sim.scheduler, sim.kv, sim.runner, sim._heap
        take = admission_shut(sched, decode_left(sched))  # arrivals cannot change its steps: it takes them in
        deadline = sim._deadline(arrivals=not take)
        j0, n = rows.j, len(sched.running)
        late = self._late(sim.now)
        self._decode_rows({})
        groups = self._groups
        cost, decode = runner.cost, runner.decode
        times: list[float] = []
        starts: list[float] = []
        t = start = sim.now
        failed = False
        for j in range(j0, rows.first_fin() + 1):
            if t >= deadline:  # step j may start only while nothing else is due
                break
            while take and heap and heap[0][0] <= t:
                sim.now = t
                sim.arrive_next()
            for st in rows.due(j):
                if not holds(kv, st.seq, rows.materialize(st, j, t) + 1):
                    failed = True  # the scheduler redoes step j itself (and preempts)
                    break
            if failed:
                break
            decode_us = decode.decode_us(self._contexts(j), groups)
            dt = cost.step(n, n, n, 0.0, 0.0, decode_us=decode_us).seconds + sim.charge_moves()
            times.append(dt)
            starts.append(t)
            t += dt
        done = len(times)
        now = start  # sim.now moved to the arrivals taken in on the way
        for dt in times:
            now += dt
            for last in late:  # first step only
                sim.rec.itl.add(now - last)
            sim.rec.itl.add(dt, n - len(late))
            late = []
        runner.busy_s += sum(times)
        # every window step decodes (the gate's input only when it has one)
        if sched.tpot_gate.target_s is not None:
            for dt in times:
                sched.observe_step(dt, True)
        runner.steps += done
        sim.num_steps += done
        sim.now = now
        if done:
            last = j0 + done - 1  # its bookkeeping finishes the rows that sampled their last token
            self._finish(rows.finishing(last), last, starts[-1], now)
            rows.j = last + 1
            rows.fresh = []
        return None if failed else done

    def _late(self, now: float) -> list[float]:
        """The last token times of the steady rows that did not sample when the step before `now` ended (the
        token budget left them out of it): their next gap is longer than a step."""
        steady = self.rows.steady
        return [st.seq.last_token_time for st in self.rows.fresh
                if steady.get(st.seq) is st and st.seq.last_token_time != now]

    def _finish(self, ending: list[Steady], j: int, began: float, now: float) -> None:
        """update_from_output for steady rows that sample their last token in step j (begun at `began`)."""
        if not ending:
            return
        sim, rows = self.sim, self.rows
        token, items, tokens = sim.runner.token, [], {}
        for st in ending:
            start = rows.materialize(st, j, began)
            items.append(ScheduledSeq(st.seq, start, 1))
            tokens[st.seq.request_id] = token(st.seq.request_id, start + 1)
        for sampled in sim.scheduler.update_from_output(ScheduledBatch(decodes=items), StepResult(tokens),
                                                        now):
            if sampled.finish_reason is not None:
                sim.finished(sampled.seq)
                rows.drop(sampled.seq)

    # ---- single steps
    # ---------------------------------------------------------------------------------------
    def _step(self) -> str:
        sim, rows = self.sim, self.rows
        sched, kv, runner = sim.scheduler, sim.kv, sim.runner
        j, now, running = rows.j, sim.now, sched.running
        budget = sched.step_budget(lambda: bool(rows.steady) or any(map(decodes, rows.others)))
        # the scheduler's split of the budget over the running rows, a steady row wanting its one token
        at = [running.index(seq) for seq in rows.others]
        wants = [1] * len(running)
        for pos, seq in zip(at, rows.others, strict=True):
            wants[pos] = seq.num_uncomputed_tokens
        grants = split_budget(budget, wants)
        mine = ScheduledBatch()  # the rows that are not steady, placed as schedule() places them
        for pos, seq in zip(at, rows.others, strict=True):
            if pos >= len(grants):
                break
            place(mine, seq, grants[pos])
        placed = [*mine.decodes, *mine.prefills]
        if len(running) - len(grants) > len(at) - len(placed):
            return self._exit(SCHEDULE)  # steady rows past the budget's end: only schedule() leaves rows out
        left = budget - sum(grants)
        # allocations, in running order: steady rows whose step changes their blocks, and the others
        rank = rows.rank
        calls: list[tuple[int, Steady | ScheduledSeq]] = [(st.rank, st) for st in rows.due(j)]
        calls += [(rank[it.seq], it) for it in placed]
        calls.sort(key=itemgetter(0))
        for _, row in calls:
            if isinstance(row, Steady):
                ok = holds(kv, row.seq, rows.materialize(row, j, now) + 1)
            else:
                ok = holds(kv, row.seq, row.start + row.num_tokens)
            if not ok:
                return self._exit(SCHEDULE)  # schedule() preempts
        num_running = len(running)
        admitted = ScheduledBatch()
        if sched.policy.groups_prefixes and admission_tried(sched, left):
            rows.materialize_all(j, now)  # grouped admission reads every running row
        sched.admit(admitted, left, now)
        if not num_running and not admitted:
            return IDLE
        self._decode_rows({it.seq: it.start for it in mine.decodes})
        contexts = self._contexts(j)
        groups = self._groups
        if admitted.decodes:
            contexts += [it.start + 1 for it in admitted.decodes]
            groups = runner.plan_rows(self._order + [it.seq for it in admitted.decodes], contexts)
            self._stale = True
        prefills = mine.prefills + admitted.prefills
        cost = runner.charge(contexts, [(it.start, it.num_tokens, it.samples) for it in prefills], groups)
        sim.now = now2 = now + (cost.seconds + sim.charge_moves())
        sched.observe_step(now2 - now, bool(contexts))
        sim.num_steps += 1
        self._apply(j, now, now2, mine.decodes, admitted, prefills)
        return CONTINUE

    def _apply(self, j: int, now: float, now2: float, singles: list[ScheduledSeq], admitted: ScheduledBatch,
               prefills: list[ScheduledSeq]) -> None:
        """The step's bookkeeping, in batch order: update_from_output for the rows that need it, the
        simulator's records (inter-token gaps counted as it counts them from a whole step),
        then each row filed anew.
        `singles`: the decode rows that are not steady."""
        sim, rows = self.sim, self.rows
        token, steady, rank = sim.runner.token, rows.steady, rows.rank
        ending = rows.finishing(j)
        decodes = [(st.rank, ScheduledSeq(st.seq, rows.materialize(st, j, now), 1)) for st in ending]
        decodes += [(rank[it.seq], it) for it in singles]
        decodes.sort(key=itemgetter(0))
        batch = ScheduledBatch([it for _, it in decodes] + admitted.decodes, prefills)
        tokens: dict[str, int] = {}
        for it in (*batch.decodes, *batch.prefills):
            if it.samples:
                tokens[it.seq.request_id] = token(it.seq.request_id, it.start + it.num_tokens)
        # gaps in batch order: every steady row samples (last token at `now`, except rows filed at this step)
        gap = now2 - now
        entries: list[tuple[int, float, int]] = []
        if not self._late(now):
            if rows.ranks:
                entries.append((rows.ranks[0], gap, len(rows.ranks)))
        else:
            entries += [(st.rank, now2 - st.seq.last_token_time if st.j0 == j else gap, 1)
                        for st in (steady[s] for s in rows.order)]
        entries += [(rank[it.seq], now2 - it.seq.last_token_time, 1) for it in singles
                    if it.samples and it.seq.first_token_time is not None]
        entries.sort(key=itemgetter(0))
        gaps: dict[float, int] = {}
        for _, g, count in entries:
            gaps[g] = gaps.get(g, 0) + count
        for it in (*admitted.decodes, *prefills):
            seq = it.seq
            if it.samples and seq.first_token_time is not None:
                g = now2 - seq.last_token_time
                gaps[g] = gaps.get(g, 0) + 1
        sampled = sim.scheduler.update_from_output(batch, StepResult(tokens), now2)
        sim.record(sampled, gaps)
        for s in sampled:
            if s.finish_reason is not None:
                rows.drop(s.seq)
        # each row that is not steady is filed anew for the next step (joined: the admitted ones)
        rows.j = j + 1
        others, rows.others, rows.fresh = rows.others, [], []
        for seq in others:
            if not seq.is_finished:
                rows.settle(seq, j + 1)
        for it in (*admitted.decodes, *admitted.prefills):
            if not it.seq.is_finished:
                rows.join(it.seq)
