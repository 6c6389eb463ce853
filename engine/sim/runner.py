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
        n_tok = n_samp = 0
        ctx = pairs = 0.0
        vocab = self.vocab
        longest = 0
        for item in batch.decodes:  # one token each: attends to start + 1 positions
            seq = item.seq
            ctx += item.start
            longest = max(longest, item.start)
            if item.samples:
                tokens[id(seq)] = output_token(seq.request_id, seq.num_tokens, vocab)
        n_tok = n_samp = len(batch.decodes)
        ctx = self.cost.decode_context(n_tok, ctx, longest)
        pairs = ctx + n_tok
        for item in batch.prefills:
            n = item.num_tokens
            n_tok += n
            ctx += item.start
            pairs += n * item.start + n * (n + 1) / 2
            if item.samples:
                n_samp += 1
                tokens[id(item.seq)] = output_token(item.seq.request_id, item.seq.num_tokens, vocab)
        # Decodes that do not sample (a preempted sequence's last recomputed token) are rare; the
        # count above treats every decode as sampling, which only prices one head row too many.
        self.last = self.cost.step(n_tok, len(batch.decodes) + len(batch.prefills), n_samp, ctx, pairs,
                                   len(batch.prefills))
        self.busy_s += self.last.seconds
        self.steps += 1
        return StepResult(tokens)
