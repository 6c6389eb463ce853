"""The running rows while the simulator fast-forwards (fastforward.py): steady decode rows advanced lazily.

A row is steady when it decodes one token per step on its own: its first token is out, one token is left to
compute, it has no stop tokens and is not swapped. From the step `j0` at whose start it had `c0` tokens
computed, at the start of step j it has c0 + j - j0 computed, one token more (the last one sampled), and
sampled last when step j-1 ended. Its Sequence is brought up to date (`materialize`) only where something
reads it: an allocation that changes anything (a block to add or to index: `due`), its last step (`fin`),
grouped admission (which reads every running row), and the end of fast-forward. Every other running row
(prefilling, or about to sample its first token) is `other`: the step mode handles it as schedule() would.
The rules are the scheduler's: when a row's step needs the KV manager (scheduler/running.py) and in which
step it samples its last token (scheduler/bookkeeping.py)."""

from __future__ import annotations

import heapq
from bisect import bisect_left
from dataclasses import dataclass

from kvloop.engine.core.sequence import Sequence, decodes
from kvloop.engine.kv.manager import KVCacheManager
from kvloop.engine.scheduler.bookkeeping import tokens_to_length
from kvloop.engine.scheduler.running import steps_to_block
from kvloop.engine.sim.workload import OutputTokens


@dataclass(slots=True, eq=False)
class Steady:
    seq: Sequence
    c0: int  # tokens computed at the start of step j0
    j0: int
    fin: int  # the step in which it samples its last token
    rank: int  # running order
    base: int  # its request's hash for the runner's sampled tokens (OutputTokens.base)

    def computed(self, j: int) -> int:
        return self.c0 + j - self.j0


class LazyRows:
    def __init__(self, kv: KVCacheManager, token: OutputTokens):
        self.kv, self.token = kv, token  # the runner's sampled tokens (workload.OutputTokens)
        self.j = 0  # the step about to run
        self.steady: dict[Sequence, Steady] = {}
        # the steady rows in running order, their ranks, and their contexts at step j less j (base + j)
        self.order: list[Sequence] = []
        self.ranks: list[int] = []
        self.bases: list[int] = []
        self.others: list[Sequence] = []  # the running rows that are not steady, in running order
        self.rank: dict[Sequence, int] = {}  # running order of every running row
        self.changed = True  # the steady set changed (the decode set's plan may have)
        self.fresh: list[Steady] = []  # rows filed steady at step j (their last token time is their own)
        self._due: dict[int, list[Steady]] = {}  # step -> steady rows to allocate for at its start
        self._fin: dict[int, list[Steady]] = {}  # step -> steady rows that sample their last token in it
        self._fins: list[tuple[int, int]] = []  # (fin, rank) heap: the first finish
        self._ranks = 0

    def reset(self, running: list[Sequence]) -> None:
        self.j = 0
        self.steady, self.others, self.rank = {}, [], {}
        self.order, self.ranks, self.bases = [], [], []
        self._due, self._fin, self._fins = {}, {}, []
        self.changed, self.fresh, self._ranks = True, [], 0
        for seq in running:
            self.join(seq)

    def join(self, seq: Sequence) -> None:
        """A row that joins the running rows (at the end of their order), steady or not."""
        self.rank[seq] = self._ranks
        self._ranks += 1
        self.settle(seq, self.j)

    def settle(self, seq: Sequence, j: int) -> None:
        """Files a running row, up to date at the start of step j: steady (lazily
        advanced from j), or other."""
        left = self.steady_for(seq)
        if left is None:
            self.others.append(seq)
            return
        kv, c0 = self.kv, seq.num_computed_tokens
        st = Steady(seq, c0, j, j + left - 1, self.rank[seq], self.token.base(seq.request_id))
        self.steady[seq] = st
        at = bisect_left(self.ranks, st.rank)
        self.order.insert(at, seq)
        self.ranks.insert(at, st.rank)
        self.bases.insert(at, c0 - j + 1)
        self.fresh.append(st)
        self.changed = True
        # first allocation: now if it has blocks to index or add, else where its next token starts a block
        due = j if kv.allocation_due(seq, c0 + 1) else j + steps_to_block(c0, kv.block_size)
        if due <= st.fin:
            self._due.setdefault(due, []).append(st)
        self._fin.setdefault(st.fin, []).append(st)
        heapq.heappush(self._fins, (st.fin, st.rank))

    def steady_for(self, seq: Sequence) -> int | None:
        """The tokens a running row samples, one a step, until its length ends it, where it is steady: a
        decode row whose first token is out (its bookkeeping only appends tokens), which no sampled token can
        stop (the simulator's outputs ignore EOS), and which is not swapped out; None for any other row."""
        if not decodes(seq) or seq.first_token_time is None or self.kv.is_swapped(seq):
            return None
        return tokens_to_length(seq)

    def drop(self, seq: Sequence) -> None:
        """A row that left the running rows (finished)."""
        st = self.steady.pop(seq, None)
        if st is not None:
            at = bisect_left(self.ranks, st.rank)
            del self.order[at], self.ranks[at], self.bases[at]
            self.changed = True
        self.rank.pop(seq, None)

    def _live(self, st: Steady) -> bool:
        return self.steady.get(st.seq) is st

    def due(self, j: int) -> list[Steady]:
        """Steady rows whose allocation at the start of step j changes something (their token starts a block,
        or they have blocks to index), in running order; each is filed for its next block."""
        rows = [st for st in self._due.pop(j, ()) if self._live(st)]
        bs = self.kv.block_size
        for st in rows:  # the next step whose token starts a block
            nxt = j + 1 + steps_to_block(st.computed(j + 1), bs)
            if nxt <= st.fin:
                self._due.setdefault(nxt, []).append(st)
        rows.sort(key=lambda st: st.rank)
        return rows

    def finishing(self, j: int) -> list[Steady]:
        """Steady rows that sample their last token in step j, in running order."""
        rows = [st for st in self._fin.pop(j, ()) if self._live(st)]
        rows.sort(key=lambda st: st.rank)
        return rows

    def first_fin(self) -> int | None:
        """The first step in which a steady row samples its last token."""
        fins = self._fins
        while fins:
            fin, rank = fins[0]
            st = self._fin.get(fin)
            if st is not None and any(s.rank == rank and self._live(s) for s in st):
                return fin
            heapq.heappop(fins)
        return None

    def materialize(self, st: Steady, j: int, now: float) -> int:
        """Writes st's row as it stands at the start of step j (`now`: when step j-1 ended); returns its
        computed tokens."""
        seq, c = st.seq, st.computed(j)
        toks = seq.token_ids
        if len(toks) == c:  # one step behind (grouped admission writes every row every step)
            toks.append(self.token.at(st.base, c))
        elif len(toks) < c:
            toks += self.token.tokens(st.base, len(toks), c + 1)
        seq.num_computed_tokens = c
        if j > st.j0:
            seq.last_token_time = now
        return c

    def materialize_all(self, j: int, now: float) -> None:
        """materialize for every steady row (grouped admission reads them all every step: kept tight, the
        sampled token computed inline as OutputTokens.at computes it)."""
        tokens, stride, span = self.token.tokens, self.token.STRIDE, self.token.span
        for st in self.steady.values():
            seq, c = st.seq, st.c0 + j - st.j0
            toks = seq.token_ids
            have = len(toks)
            if have == c:
                toks.append(100 + (st.base + stride * c) % span)
            elif have < c:
                toks += tokens(st.base, have, c + 1)
            seq.num_computed_tokens = c
            if j > st.j0:
                seq.last_token_time = now
