"""Cascade plan for one decode step: which rows attend to which shared prefix once, as a group.

Block ids are the KV manager's identities (equal ids = the same cached K/V), so rows whose block tables
begin with the same ids share that prefix. A trie over the rows' tables finds every shared prefix,
nested ones included (a system prompt shared by all, a document shared by some). A node becomes a
group only where the step-cost model says cascading it is faster. Groups chain: each group covers
the tokens from the end of its nearest cascaded ancestor (or 0) to the end of its node, so a row's
context splits into its groups' segments, in order, then its own suffix [suffix_start, context_len).

Pure Python (no torch): the scheduler and the simulator can build plans too."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

# worth(members, shared_tokens) -> bool: whether one group of `members` rows attending to
# `shared_tokens` tokens together beats each of them reading those tokens alone.
Worth = Callable[[int, int], bool]


@dataclass(frozen=True)
class CascadeGroup:
    rows: tuple[int, ...]  # decode rows (indices into the step's decode batch), ascending
    block_ids: tuple[int, ...]  # the shared blocks of this segment, in table order (all full)
    start_token: int  # first token of the segment in each member's context (a block edge)
    num_tokens: int  # tokens in the segment: len(block_ids) * block_size


@dataclass(frozen=True)
class CascadePlan:
    groups: tuple[CascadeGroup, ...]  # parents before children; a row is in at most one group per depth
    suffix_start: tuple[int, ...]  # per decode row: first token not covered by a group (0: none)
    block_size: int

    @property
    def num_rows(self) -> int:
        return len(self.suffix_start)

    def row_groups(self, row: int) -> list[CascadeGroup]:
        return [g for g in self.groups if row in g.rows]


def build_plan(tables: Sequence[Sequence[int]], context_lens: Sequence[int], block_size: int,
               worth: Worth, nested: bool = True) -> CascadePlan | None:
    """The cascade plan for decode rows with these block tables and context lengths (the new token
    included), or None when no group pays. Only blocks filled before this step are shared: a block
    the step writes into belongs to one row. nested=False keeps only the prefix common to every row
    (vLLM's cascade: one group of all rows at most)."""
    # blocks of row r that hold only tokens written before this step
    full = [max(0, (n - 1) // block_size) for n in context_lens]
    groups: list[CascadeGroup] = []
    suffix = [0] * len(tables)

    # Iterative walk over trie nodes: (rows sharing tables[:depth], depth, covered) where covered is the
    # block index up to which the nearest cascaded ancestor already reads for these rows.
    stack: list[tuple[list[int], int, int]] = [(list(range(len(tables))), 0, 0)]
    while stack:
        rows, depth, covered = stack.pop()
        end = depth
        if len(rows) > 1:  # extend the node while every row holds the same full block
            end += _shared_run(tables, rows, depth, min(map(full.__getitem__, rows)))
        if end > covered and len(rows) > 1 and worth(len(rows), (end - covered) * block_size):
            ids = tuple(map(int, tables[rows[0]][covered:end]))
            groups.append(CascadeGroup(tuple(sorted(rows)), ids, covered * block_size, len(ids) * block_size))
            covered = end
            for r in rows:
                suffix[r] = covered * block_size
        if not nested:
            break  # the root node (every row) is the only candidate
        children: dict[int, list[int]] = {}
        for r in rows:
            if end < full[r]:
                children.setdefault(int(tables[r][end]), []).append(r)
        for child in children.values():
            if len(child) > 1:
                stack.append((child, end, covered))
    if not groups:
        return None
    groups.sort(key=lambda g: (g.start_token, g.rows))
    return CascadePlan(tuple(groups), tuple(suffix), block_size)


def _shared_run(tables: Sequence[Sequence[int]], rows: list[int], depth: int, limit: int) -> int:
    """How many blocks from `depth` (short of `limit`) every row's table holds alike. The rows share their
    first `depth` blocks, so the least and the greatest of their tables (compared as lists, in C) bound all
    the others: the run they share is everyone's."""
    if limit <= depth:
        return 0
    picked = [tables[r] for r in rows]
    lo, hi = min(picked), max(picked)
    return common_run(lo, depth, hi, depth, limit - depth)


def common_run(a: Sequence[int], i: int, b: Sequence[int], j: int, n: int) -> int:
    """How many of a[i:i+n] and b[j:j+n] agree from the first on: slices compared in C, halving the span
    that holds the first difference."""
    if a[i : i + n] == b[j : j + n]:
        return n
    lo, hi = 0, n  # they agree on [0, lo); the first difference lies in [lo, hi)
    while hi - lo > 8:
        mid = (lo + hi) // 2
        if a[i + lo : i + mid] == b[j + lo : j + mid]:
            lo = mid
        else:
            hi = mid
    while a[i + lo] == b[j + lo]:
        lo += 1
    return lo


class CascadePlanner:
    """Builds plans and reuses the last one while the decode set is unchanged.

    The key is the step's decode rows in order, each as (request id, preemption count): any join, leave,
    finish or preemption changes it (a swapped row can be back within one step: its count tells). While
    the key holds, a plan stays correct: its shared blocks are indexed, so the KV manager never swaps them
    out of a running row's table, and each row's own part is read from its current table every step. What
    a reused plan can miss is sharing that appears mid-decode (the manager deduplicating two rows'
    identical new blocks); it is picked up when the decode set next changes."""

    def __init__(self, block_size: int, worth: Worth, nested: bool = True):
        self.block_size = block_size
        self.worth = worth
        self.nested = nested  # False: only the prefix common to all rows (see build_plan)
        self._key: tuple | None = None
        self._plan: CascadePlan | None = None
        self.builds = 0  # plans actually built (tests check the reuse)

    def plan(self, key: tuple, tables: Sequence[Sequence[int]], context_lens: Sequence[int]) -> CascadePlan | None:
        if key != self._key:
            self._plan = build_plan(tables, context_lens, self.block_size, self.worth, self.nested)
            self._key = key
            self.builds += 1
        return self._plan
