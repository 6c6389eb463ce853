"""A runner for the scheduler's Runner protocol that computes nothing: it prices the batch with
the cost model and 'samples' a deterministic token per sampling sequence (outputs follow the
workload's lengths; ignore_eos)."""

from __future__ import annotations

from kvloop.engine.scheduler.batch import ScheduledBatch, StepResult
from kvloop.engine.sim.cost import CostModel, StepCost
from kvloop.engine.sim.workload import output_token


class SimRunner:
    def __init__(self, cost: CostModel, block_size: int):
        self.cost = cost
        self.block_size = block_size
        self.vocab = cost.model.vocab
        self.last: StepCost | None = None
        self.busy_s = 0.0
        self.steps = 0

    def execute(self, batch: ScheduledBatch) -> StepResult:
        tokens: dict[int, int] = {}
        vocab = self.vocab
        for item in (*batch.decodes, *batch.prefills):
            if item.samples:
                seq = item.seq
                tokens[id(seq)] = output_token(seq.request_id, seq.num_tokens, vocab)
        # Decodes that do not sample (a preempted sequence's last recomputed token) are rare; pricing
        # every decode as sampling only prices one head row too many (and matches fast-forward windows).
        items = [(it.start, 1, True) for it in batch.decodes]
        items += [(it.start, it.num_tokens, it.samples) for it in batch.prefills]
        self.last = self.cost.step_for(items)
        self.busy_s += self.last.seconds
        self.steps += 1
        return StepResult(tokens)
