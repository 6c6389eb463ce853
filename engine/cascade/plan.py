"""Cascade plan for one decode step: which rows attend to which shared prefix once, as a group.

The shared prefixes are the prefix tree's nodes with two or more rows (tree.py). A node becomes a group only
where the step-cost model says cascading it is faster. Groups chain: each group covers the tokens from the end
of its nearest cascaded ancestor (or 0) to the end of its node, so a row's context splits into its groups'
segments, in order, then its own suffix [suffix_start, context_len). The `common` scope (cascade_scope.py)
looks at the root alone: the prefix every row shares (vLLM's cascade, one group of all rows at most).

One planner serves every caller: the runner reads whole plans (`plan`), the scheduler's and the simulator's
pricing only each group's (members, shared tokens) (`shapes`). Pure Python (no torch)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence, Set
from dataclasses import dataclass
from operator import itemgetter

from kvloop.engine.cascade.tree import PrefixTree, common_run

# worth(members, shared_tokens) -> bool: whether one group of `members` rows attending to
# `shared_tokens` tokens together beats each of them reading those tokens alone.
Worth = Callable[[int, int], bool]
# a group found: (first token, first row's position, members, shared tokens, its rows' identities; None: all)
Found = tuple[int, int, int, int, Set[Hashable] | None]


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


class CascadePlanner:
    """Plans decode steps and reuses the last plan while the decode set is unchanged.

    The key is one identity per decode row, in order (the runner's: each row's stint): any join, leave,
    finish or preemption changes it. While the key holds, a plan stays correct: its shared blocks are
    indexed, so the KV manager never swaps them out of a running row's table, and each row's own part is
    read from its current table every step. What a reused plan can miss is sharing that appears mid-decode
    (the manager deduplicating two rows' identical new blocks); it is picked up when the decode set next
    changes. Where the key changes, the tree is updated for the rows that changed."""

    def __init__(self, block_size: int, worth: Worth, nested: bool = True):
        self.block_size = block_size
        self.worth = worth
        self.nested = nested  # False: only the prefix common to all rows
        self._worth: dict[tuple[int, int], bool] = {}  # worth's answers (a pure function of its two ints)
        self._tree = PrefixTree(block_size)
        self._key: tuple | None = None
        self._rows: dict[Hashable, int] = {}  # the key's identities -> positions (the nested scope's)
        self._positions = False  # whether the tree's rows are positions (a key with a repeated identity)
        self._found: list[Found] = []
        self._plan: CascadePlan | None = None
        self._shapes: list[tuple[int, int]] | None = None
        self._planned = False  # whether _plan is the key's plan
        self.builds = 0  # plans actually built (tests check the reuse)

    def plan(self, key: tuple, tables: Sequence[Sequence[int]], context_lens: Sequence[int],
             fixed: Sequence[int] | None = None) -> CascadePlan | None:
        """The step's plan (None: no group pays). tables, context_lens (the new token included): per row;
        fixed: see PrefixTree.update."""
        self._refresh(key, tables, context_lens, fixed)
        if not self._planned:
            self._plan, self._planned = self._read_plan(tables), True
        return self._plan

    def shapes(self, key: tuple, tables: Sequence[Sequence[int]], context_lens: Sequence[int],
               fixed: Sequence[int] | None = None) -> list[tuple[int, int]]:
        """(members, shared tokens) of each group of plan(...)'s plan, in its order: what pricing reads."""
        self._refresh(key, tables, context_lens, fixed)
        if self._shapes is None:
            self._shapes = [(members, tokens) for _, _, members, tokens, _ in self._found]
        return self._shapes

    def _refresh(self, key: tuple, tables: Sequence[Sequence[int]], context_lens: Sequence[int],
                 fixed: Sequence[int] | None) -> None:
        if key == self._key:
            return
        self._key = key
        self.builds += 1
        self._plan, self._shapes, self._planned = None, None, False
        if not self.nested:
            self._found = self._common(tables, context_lens)
            return
        rows = self._rows = dict(zip(key, range(len(key)), strict=True))
        if len(rows) != len(key) or self._positions:  # a tree of positions holds no identities: start afresh
            self._tree = PrefixTree(self.block_size)
        self._positions = len(rows) != len(key)
        if self._positions:  # two rows with one identity: rows by position, for this key alone
            key = tuple(range(len(key)))
            self._rows = dict(zip(key, key, strict=True))
            fixed = None
        self._tree.update(key, tables, context_lens, fixed)
        self._found = self._walk()

    def _pays(self, members: int, tokens: int) -> bool:
        known = self._worth
        pays = known.get((members, tokens))
        if pays is None:
            if len(known) >= 1 << 16:
                known.clear()  # a bound for a long-lived planner (shapes are few in practice)
            pays = known[members, tokens] = self.worth(members, tokens)
        return pays

    def _walk(self) -> list[Found]:
        """The groups: from the root down the shared nodes, a node cascades where its rows' tokens past
        the nearest cascaded ancestor pay; ordered by first token, then by first row (groups that start at
        the same token never share a row)."""
        bs, pays, position = self.block_size, self._pays, self._rows
        found: list[Found] = []
        stack = [(self._tree.root, 0)]
        while stack:
            node, covered = stack.pop()
            members = len(node.rows)
            if members < 2:
                continue
            if node.end > covered and pays(members, (node.end - covered) * bs):
                rows = node.rows
                found.append((covered * bs, min(map(position.__getitem__, rows)), members,
                              (node.end - covered) * bs, rows))
                covered = node.end
            for child in node.shared.values():
                stack.append((child, covered))
        found.sort()  # never compares the row sets: groups starting at one token have distinct first rows
        return found

    def _common(self, tables: Sequence[Sequence[int]], context_lens: Sequence[int]) -> list[Found]:
        """The common scope's group: the tree's root alone, the run of full blocks every row holds alike. It
        needs no tree: the least and the greatest table (compared as lists, in C) bound all the others, so the
        run they share is everyone's."""
        bs = self.block_size
        if len(tables) < 2 or min(context_lens) <= bs:
            return []  # fewer than two rows, or a row without a full block
        if tables[0][0] != tables[-1][0] or len(set(map(itemgetter(0), tables))) > 1:
            return []  # no first block common to all (mixed traffic: most steps), told in C
        tokens = bs * common_run(min(tables), 0, max(tables), 0, (min(context_lens) - 1) // bs)
        return [(0, 0, len(tables), tokens, None)] if tokens and self._pays(len(tables), tokens) else []

    def _read_plan(self, tables: Sequence[Sequence[int]]) -> CascadePlan | None:
        """The found groups as a plan: each group's rows, its blocks (its first row's) and every row's suffix
        start (parents come first, so a row's deepest group sets it)."""
        if not self._found:
            return None
        position, bs, n = self._rows, self.block_size, len(tables)
        groups: list[CascadeGroup] = []
        suffix = [0] * n
        for start, first, _, tokens, members in self._found:
            end = start + tokens
            rows = tuple(range(n)) if members is None else tuple(sorted(map(position.__getitem__, members)))
            groups.append(CascadeGroup(rows, tuple(tables[first][start // bs : end // bs]), start, tokens))
            for r in rows:
                suffix[r] = end
        return CascadePlan(tuple(groups), tuple(suffix), bs)


def build_plan(tables: Sequence[Sequence[int]], context_lens: Sequence[int], block_size: int,
               worth: Worth, nested: bool = True) -> CascadePlan | None:
    """The cascade plan for decode rows with these block tables and context lengths (the new token included),
    or None when no group pays: a planner's plan with no earlier step. nested=False keeps only the prefix
    common to every row."""
    return CascadePlanner(block_size, worth, nested).plan(tuple(range(len(tables))), tables, context_lens)
