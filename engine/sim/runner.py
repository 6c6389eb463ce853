"""A runner for the scheduler's Runner protocol that computes nothing: it prices the batch with
the cost model and 'samples' a deterministic token per sampling sequence (outputs follow the
workload's lengths; ignore_eos). Decode rows are priced with the cascade plan the real runner would
build from their block tables, under the mode's scope (the scheduler's step-cost function)."""

from __future__ import annotations

from operator import attrgetter

from kvloop.engine.cascade.step_cost import StepCost as DecodeCost
from kvloop.engine.core.batch import ScheduledBatch, ScheduledSeq, StepResult
from kvloop.engine.core.sequence import Sequence
from kvloop.engine.sim.cost import CostModel, StepCost
from kvloop.engine.sim.workload import OutputTokens

STINT = attrgetter("stint")  # a running row's identity (Sequence.stint)
TABLE, COMMITTED = attrgetter("block_table"), attrgetter("block_hashes")


class SimRunner:
    def __init__(self, cost: CostModel, block_size: int, decode: DecodeCost | None = None):
        self.cost = cost
        self.block_size = block_size
        self.decode = decode or cost.decode  # the scheduler's, so both use one scope and one model
        self.planner = self.decode.planner()  # reused while the decode set is unchanged, as the runner's
        self.vocab = cost.model.vocab
        self.token = OutputTokens(self.vocab)  # the 'sampled' token of a request at a position
        self._key: tuple | None = None
        self._shapes: list[tuple[int, int]] = []
        self.last: StepCost | None = None
        self.busy_s = 0.0
        self.steps = 0

    def execute(self, batch: ScheduledBatch) -> StepResult:
        tokens: dict[str, int] = {}
        token = self.token
        for item in (*batch.decodes, *batch.prefills):
            seq = item.seq
            if item.start + item.num_tokens == len(seq.token_ids):  # it samples
                tokens[seq.request_id] = token(seq.request_id, item.start + item.num_tokens)
        self.price(batch.decodes, batch.prefills)
        return StepResult(tokens)

    def price(self, decodes: list[ScheduledSeq], prefills: list[ScheduledSeq]) -> StepCost:
        """Prices a step of these rows (the batch's) and counts it. Decodes that do not sample (a preempted
        sequence's last recomputed token) are rare; pricing every decode as sampling only prices one head row
        too many (and matches fast-forward windows)."""
        contexts = [it.start + 1 for it in decodes]
        items = [(it.start, it.num_tokens, it.samples) for it in prefills]
        return self.charge(contexts, items, self.plan_rows([it.seq for it in decodes], contexts))

    def charge(self, contexts: list[int], items: list[tuple[int, int, bool]],
               groups: list[tuple[int, int]]) -> StepCost:
        """Prices and counts a step of decode rows with these contexts (their plan's `groups`) and these
        (start, tokens, samples) items."""
        self.last = self.cost.step_of(contexts, items, groups)
        self.busy_s += self.last.seconds
        self.steps += 1
        return self.last

    def plan_rows(self, seqs: list[Sequence], contexts: list[int]) -> list[tuple[int, int]]:
        """(members, shared tokens) of the cascaded groups of decode rows `seqs` with these contexts (the new
        token included): the plan holds while the decode set does, as the runner's."""
        if len(seqs) < 2:
            return []
        key = tuple(map(STINT, seqs))  # the runner's key: each row's stint
        if key != self._key:
            self._key = key
            # a decode row's full blocks are committed (indexed): they stay while it runs
            fixed = list(map(len, map(COMMITTED, seqs)))
            self._shapes = self.planner.shapes(key, list(map(TABLE, seqs)), contexts, fixed)
        return self._shapes
