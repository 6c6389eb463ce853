"""Which decode rows share which prefix: a radix tree over their full blocks, kept across steps (pure Python).

Block ids are the KV manager's identities (equal ids = the same cached K/V), so rows whose block tables begin
with the same ids share that prefix. Only blocks filled before the step count (a block the step writes into
belongs to one row). A node holds a run of blocks [start, end) and the rows that pass through it; an edge ends
where its rows part or one of them ends, and a node that neither parts nor ends a row is merged with its only
child. The nodes with two or more rows are exactly the shared prefixes, nested ones included; the plan
(plan.py) picks its groups among them.

The tree is updated for the rows that changed since the last update only (joined, left, or grew a block): the
simulator and the scheduler plan near saturation, where the decode set changes every step. A row's blocks are
compared with what the tree holds, in C, except those the caller says cannot have changed (committed ones)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import compress
from operator import ne


class Node:
    __slots__ = ("start", "end", "edge", "rows", "ends", "children", "shared")

    def __init__(self, start: int, edge: list[int], rows: set, ends: set, children: dict | None = None,
                 shared: dict | None = None):
        self.start, self.end, self.edge = start, start + len(edge), edge  # blocks [start, end), their ids
        self.rows = rows  # every row whose full blocks pass through start (its subtree's rows)
        self.ends = ends  # the rows whose full blocks end at `end`
        self.children: dict[int, Node] = children if children is not None else {}  # by the block at `end`
        # the children that two or more rows pass through (the only ones a group can be found under): the plan
        # walks these, not every row's leaf
        self.shared: dict[int, Node] = shared if shared is not None else {}


def full_blocks(context_lens: Sequence[int], block_size: int) -> list[int]:
    """Per row: its blocks that hold only tokens written before this step (context_len counts the new one)."""
    return [(n - 1) // block_size if n > 0 else 0 for n in context_lens]


class PrefixTree:
    """The rows of the last update, by identity; update() brings it to a new decode set."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.root = Node(0, [], set(), set())
        self._full: dict[Hashable, list[int]] = {}  # each row's full blocks, as the tree holds them
        # rows whose held blocks cannot change (see update's `fixed`) -> how many they hold
        self._sealed: dict[Hashable, int] = {}
        self._end: dict[Hashable, Node] = {}  # the node each row's blocks end at

    def blocks(self, row: Hashable) -> list[int]:
        """The full blocks the tree holds for a row."""
        return self._full[row]

    def update(self, key: Sequence[Hashable], tables: Sequence[Sequence[int]], context_lens: Sequence[int],
               fixed: Sequence[int] | None = None) -> None:
        """Brings the tree to these rows (key: one distinct identity per row; a row whose blocks changed in
        place is compared anew). fixed: per row, how many of its first blocks stay as they are while it keeps
        its identity (the KV manager's committed blocks); those are not compared again. None: every held
        block is compared."""
        held, sealed = self._full, self._sealed
        for row in held.keys() - key:  # rows that left
            self._remove(row, held.pop(row))
            sealed.pop(row, None)
        fulls = full_blocks(context_lens, self.block_size)
        fixed = fixed or [0] * len(key)
        # the most common row, sealed and holding `full` blocks already (nothing new, nothing that can have
        # changed), is passed over without a Python step of its own: only the others are looked at
        for i in compress(range(len(key)), map(ne, map(sealed.get, key), fulls)):
            row, table, full, fix = key[i], tables[i], fulls[i], fixed[i]
            old = held.get(row)
            if old is None:
                held[row] = blocks = list(table[:full])
                self._insert(row, blocks)
            else:
                have = len(old)
                if full != have or table[:have] != old:
                    grows = have < full and (row in sealed or table[:have] == old)
                    if not (grows and self._grow(row, table, full)):  # else its own leaf took the new blocks
                        self._remove(row, old)
                        held[row] = blocks = list(table[:full])
                        self._insert(row, blocks)
            if fix >= full:
                sealed[row] = len(held[row])
            else:
                sealed.pop(row, None)

    def _grow(self, row: Hashable, table: Sequence[int], full: int) -> bool:
        """Extends a row that ends alone at a leaf of its own (its blocks so far unchanged): the leaf's edge
        takes its new blocks. False: it ends elsewhere (the caller removes and inserts it)."""
        leaf = self._end[row]
        if len(leaf.rows) > 1 or leaf.children:
            return False
        blocks = self._full[row]
        new = table[len(blocks) : full]
        blocks += new
        leaf.edge += new
        leaf.end = full
        return True

    def _insert(self, row: Hashable, blocks: list[int]) -> None:
        node = self.root
        if not node.rows:
            self.root = self._end[row] = Node(0, blocks[:], {row}, {row})
            return
        parent: Node | None = None
        while True:
            stop = min(node.end, len(blocks))
            matched = node.start + common_run(node.edge, 0, blocks, node.start, stop - node.start)
            if matched < node.end:
                self._split(node, matched)
            node.rows.add(row)
            if parent is not None and len(node.rows) == 2:
                parent.shared[node.edge[0]] = node
            if len(blocks) == node.end:
                node.ends.add(row)
                self._end[row] = node
                return
            child = node.children.get(blocks[node.end])
            if child is None:
                leaf = node.children[blocks[node.end]] = Node(node.end, blocks[node.end :], {row}, {row})
                self._end[row] = leaf
                return
            parent, node = node, child

    def _split(self, node: Node, at: int) -> None:
        """Cuts node's edge at `at`: the rest, with node's children and ending rows, becomes its one child."""
        cut = at - node.start
        tail = Node(at, node.edge[cut:], set(node.rows), node.ends, node.children, node.shared)
        node.edge, node.end, node.ends, node.children = node.edge[:cut], at, set(), {tail.edge[0]: tail}
        node.shared = {tail.edge[0]: tail} if len(tail.rows) > 1 else {}
        for row in tail.ends:
            self._end[row] = tail

    def _remove(self, row: Hashable, blocks: list[int]) -> None:
        del self._end[row]
        path = []
        node = self.root
        while True:
            path.append(node)
            node.rows.discard(row)
            if len(blocks) == node.end:
                node.ends.discard(row)
                break
            node = node.children[blocks[node.end]]
        for i in range(len(path) - 1, -1, -1):
            node = path[i]
            if i and len(node.rows) == 1:  # one row left: no longer shared
                del path[i - 1].shared[node.edge[0]]
            if not node.rows:
                if i:
                    del path[i - 1].children[node.edge[0]]
                else:
                    self.root = Node(0, [], set(), set())
            elif not node.ends and len(node.children) == 1:  # nobody parts or ends here: merge the child
                (child,) = node.children.values()
                node.edge, node.end = node.edge + child.edge, child.end
                node.ends, node.children, node.shared = child.ends, child.children, child.shared
                for moved in node.ends:
                    self._end[moved] = node


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
