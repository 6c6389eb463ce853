"""A runner for the scheduler's Runner protocol that computes nothing: it prices the batch with
the cost model and 'samples' a deterministic token per sampling sequence (outputs follow the
workload's lengths; ignore_eos). Decode rows are priced with the cascade plan the real runner would
build from their block tables, under the mode's scope (the scheduler's step-cost function)."""

from __future__ import annotations

from kvloop.engine.scheduler.batch import ScheduledBatch, StepResult
from kvloop.engine.scheduler.sequence import Sequence
from kvloop.engine.scheduler.step_cost import StepCost as DecodeCost
from kvloop.engine.sim.cost import CostModel, StepCost
from kvloop.engine.sim.workload import output_token


class SimRunner:
    def __init__(self, cost: CostModel, block_size: int, decode: DecodeCost | None = None):
        self.cost = cost
        self.block_size = block_size
        self.decode = decode or cost.decode  # the scheduler's, so both use one scope and one model
        self.planner = self.decode.planner()  # reused while the decode set is unchanged, as the runner's
        self.vocab = cost.model.vocab
        self.last: StepCost | None = None
        self.busy_s = 0.0
        self.steps = 0

    def execute(self, batch: ScheduledBatch) -> StepResult:
        tokens: dict[str, int] = {}
        vocab = self.vocab
        for item in (*batch.decodes, *batch.prefills):
            if item.samples:
                seq = item.seq
                tokens[seq.request_id] = output_token(seq.request_id, seq.num_tokens, vocab)
        # Decodes that do not sample (a preempted sequence's last recomputed token) are rare; pricing
        # every decode as sampling only prices one head row too many (and matches fast-forward windows).
        items = [(it.start, 1, True) for it in batch.decodes]
        items += [(it.start, it.num_tokens, it.samples) for it in batch.prefills]
        self.last = self.cost.step_for(items, self.groups([it.seq for it in batch.decodes],
                                                          [it.start for it in batch.decodes]))
        self.busy_s += self.last.seconds
        self.steps += 1
        return StepResult(tokens)

    def groups(self, seqs: list[Sequence], starts: list[int]) -> list[tuple[int, int]]:
        """(members, shared tokens) of the cascaded groups of decode rows `seqs` at positions `starts`."""
        if len(seqs) < 2:
            return []
        key = tuple((s.request_id, s.num_preemptions) for s in seqs)
        plan = self.planner.plan(key, [s.block_table for s in seqs], [c + 1 for c in starts])
        return self.decode.group_shapes(plan)
