"""Prompt-lookup (n-gram) speculation: proposals, and how many of them each row gets this step (pure Python).

Proposals: the longest recent n-gram of the request's own tokens (prompt + output so far; n from
NGRAM_MAX down to NGRAM_MIN) that occurred earlier in them; the tokens that followed its latest earlier
occurrence are proposed (prompt lookup decoding, as vLLM's `ngram` method and its prompt_lookup_min/max
do). The runner verifies them in the step (model_runner.py) and keeps the sampled tokens that equal them,
so the output is what the model would have sampled one token a step (exact by construction).

How many: `ngram` proposes up to the cap whenever a match is found; `auto` only where the step is
small and nothing waits (SpeculationPolicy.length); `off` never."""

from __future__ import annotations

from dataclasses import dataclass, field

MODES = ("auto", "ngram", "off")
NGRAM_MAX = 3  # vLLM's prompt_lookup_max default is 5 in examples; 3 matches short copied spans
NGRAM_MIN = 1
LOOKBACK = 1024  # tokens searched back from the end: keeps the proposer O(window) per row per step
RECOVERY = 0.05  # auto: share of the way back to the prior acceptance per step a row did not speculate


def propose(tokens: list[int], k: int, n_max: int = NGRAM_MAX, n_min: int = NGRAM_MIN,
            lookback: int = LOOKBACK) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix n-gram of `tokens`
    (n_max down to n_min); [] when none recurs."""
    if k <= 0:
        return []
    end = len(tokens)
    lo = max(0, end - lookback)
    window = tokens[lo:]
    w = len(window)
    backwards = window[::-1]  # list.index from the end, in C: the candidates latest first
    for n in range(min(n_max, w - 1), n_min - 1, -1):
        suffix = window[w - n:]
        first = suffix[0]
        # the latest earlier start i (i + n <= w - 1: the match ends before the suffix's last token)
        r = n  # backwards[r] is window[w - 1 - r]: starts at w - n - 1 and below
        while True:
            try:
                r = backwards.index(first, r)
            except ValueError:
                break
            i = w - 1 - r
            if window[i:i + n] == suffix:
                return window[i + n: i + n + k]
            r += 1
    return []


def same_class_limit(classes: list[int], tokens: int) -> int | None:
    """Over size classes (runner/row_invariance.py): the largest step size with the class of a
    `tokens`-token step; None: no bound (past the probe)."""
    if tokens >= len(classes) - 1:
        return None
    c = classes[tokens]
    m = tokens
    while m + 1 < len(classes) and classes[m + 1] == c:
        m += 1
    return None if m == len(classes) - 1 else m


@dataclass
class Acceptance:
    """A row's measured acceptance: an exponential moving average of accepted / proposed per step."""

    rate: float = 0.5  # a prior between "never" and "always" until measured
    weight: float = 0.3  # of the newest step

    def observe(self, proposed: int, accepted: int) -> None:
        if proposed > 0:
            self.rate += self.weight * (accepted / proposed - self.rate)

    def idle(self) -> None:
        """A step without proposals: the rate drifts back toward the prior (RECOVERY of the way a step), so
        a row whose text stopped repeating is tried again later rather than never."""
        self.rate += RECOVERY * (Acceptance.rate - self.rate)


@dataclass
class SpeculationStats:
    """Counters for the snapshot and Prometheus (vLLM's spec_decode names: drafts, draft tokens, accepted
    tokens, accepted tokens per position)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def record(self, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += proposed
        self.num_accepted_tokens += accepted
        if len(self.accepted_per_pos) < proposed:
            self.accepted_per_pos.extend([0] * (proposed - len(self.accepted_per_pos)))
        for i in range(accepted):
            self.accepted_per_pos[i] += 1


def expected_gain(rate: float, k: int) -> float:
    """Tokens beyond the one a step always yields, expected from k proposals accepted each with
    probability `rate` until the first rejection: rate + rate^2 + ... + rate^k."""
    return sum(rate ** i for i in range(1, k + 1))


def auto_length(rate: float, k_max: int, row_cost_us: float, step_us: float) -> int:
    """The proposal length that pays by the cost model: each extra proposal adds `row_cost_us` (its decode
    row's attention over the model's layers, step_cost.py) to a step of `step_us` (the measured decode step,
    tpot_gate.py), and is worth `rate^i` of a step. The longest k whose marginal proposal still gains more
    step time than it costs; 0 when none does."""
    if step_us <= 0:
        return 0
    k = 0
    while k < k_max and rate ** (k + 1) * step_us > row_cost_us:
        k += 1
    return k


class Speculator:
    """The scheduler's side: which decode rows get proposals this step and how many, their slots, and what
    acceptance the rows measured.

    `size_classes`: the step sizes whose rows the model's linears round alike (runner/row_invariance.py;
    None: every size alike): proposals never carry a step (nor its sampled rows, the head's) into another
    class, so every row runs the arithmetic it would run without them. `free_tokens`: the step size up to
    which `auto` counts an extra decode row's linears free (the weights are read once for all rows: the
    bf16-weight kernel's decode-sized steps, kernels/cpu/linear_bf16w.dense_above_rows); past it `auto`
    proposes nothing."""

    def __init__(self, mode: str, knobs, size_classes: list[int] | None = None, free_tokens: int = 12):
        """knobs: the scheduler's live knobs (core/knobs.py), whose speculation_max_tokens caps proposals (the
        configured value, or the coordinator's lower one)."""
        if mode not in MODES:
            raise ValueError(f"speculation must be one of {MODES}")
        self.mode = mode
        self.knobs = knobs
        self.size_classes = size_classes
        self.free_tokens = free_tokens
        self.acceptance: dict[int, Acceptance] = {}  # by Sequence id; dropped when it finishes
        self.stats = SpeculationStats()
        self.model_layers = 1  # the engine sets its model's: row_cost_us prices one layer's attention
        self.step_us: float | None = None  # recent decode steps' duration (EMA), the auto rule's scale

    @property
    def max_tokens(self) -> int:
        return self.knobs.speculation_max_tokens

    @property
    def active(self) -> bool:
        return self.mode != "off" and self.max_tokens > 0

    def observe_step(self, seconds: float) -> None:
        us = seconds * 1e6
        self.step_us = us if self.step_us is None else self.step_us + 0.2 * (us - self.step_us)

    def assign(self, batch, budget: int, kv, waiting: bool, row_cost_us) -> None:
        """Proposals for the batch's decode rows within `budget` tokens and the pool's free blocks (never an
        eviction or a preemption: proposals only take what nobody needs this step). `waiting`: requests wait
        that this step did not admit (auto then yields). row_cost_us(context): one more decode row's price."""
        if not self.active or not batch.decodes:
            return
        if self.mode == "auto" and (waiting or self.step_us is None):
            return
        base = batch.num_tokens
        room = budget
        limit = None
        if self.size_classes is not None:
            sampled = len(batch.decodes) + sum(1 for p in batch.prefills if p.samples)
            for n in (base, sampled):
                top = same_class_limit(self.size_classes, n)
                if top is not None:
                    limit = top - n if limit is None else min(limit, top - n)
        if self.mode == "auto":
            free = max(0, self.free_tokens - base)
            limit = free if limit is None else min(limit, free)
        if limit is not None:
            room = min(room, limit)
        bs = kv.block_size
        for item in batch.decodes:
            if room <= 0:
                return
            seq = item.seq
            p = seq.params
            k = min(self.max_tokens, room, p.max_tokens - seq.num_output_tokens - 1)
            if self.mode == "auto" and k > 0:
                acceptance = self.acceptance.setdefault(id(seq), Acceptance())
                k = auto_length(acceptance.rate, k, row_cost_us(seq.num_tokens), self.step_us)
                if k <= 0:
                    acceptance.idle()
            if k <= 0:
                continue
            draft = propose(seq.token_ids, k)
            if not draft:
                continue
            # slots: the row's blocks, grown from free blocks only (never evicting a cached one)
            need = -(-(item.start + 1 + len(draft)) // bs) - len(seq.block_table)
            if need > 0 and (need > kv.pool.num_free or not kv.allocate(seq, item.start + 1 + len(draft))):
                draft = draft[: len(seq.block_table) * bs - item.start - 1]
                if not draft:
                    continue
            item.draft = draft
            room -= len(draft)

    def settle(self, item, tokens: list[int], kv) -> None:
        """After the step (`tokens`: what the row kept): the row's acceptance and the counters; its blocks
        wholly past its tokens returned."""
        proposed = len(item.draft)
        if not proposed:
            return
        accepted = 0
        while accepted < min(proposed, len(tokens)) and tokens[accepted] == item.draft[accepted]:
            accepted += 1
        self.stats.record(proposed, accepted)
        self.acceptance.setdefault(id(item.seq), Acceptance()).observe(proposed, accepted)
        seq = item.seq
        if seq.block_table:
            kv.trim(seq, -(-seq.num_tokens // kv.block_size))

    def forget(self, seq) -> None:
        self.acceptance.pop(id(seq), None)
