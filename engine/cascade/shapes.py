"""The shapes of a decode step's cascade plan, kept up to date across steps (pure Python).

The scheduler (pricing past the cap) and the simulator (pricing every step) need only each cascaded
group's (members, shared tokens), in the plan's order, and near saturation the decode set changes every
step, so the runner's CascadePlanner would build a plan from scratch every step: a walk over every row's
block table. `ShapePlanner` gives exactly `group_shapes(build_plan(...))` instead from a radix tree over the
rows' full blocks that it updates for the rows that changed since the last plan (joined, left, or grew a
block; a row's blocks are compared with what the tree holds, in C, except those the caller says cannot have
changed: committed ones), then reads the groups off its nodes with two or more rows. The `common` scope
(only the prefix every row shares) needs no tree: build_plan looks at each row once.

Why the tree gives build_plan's plan: build_plan extends a node of rows R at depth d to the longest run of
full blocks all of R hold alike, stopping where a row's full blocks end, and splits the rows that go on by
their next block; the tree keeps exactly those nodes (an edge ends where its rows part or one of them ends,
and a node that neither parts nor ends any row is merged with its only child). Groups are then the same
nodes under the same cost gate; they are ordered as build_plan orders them, by first token and then by
their first row (groups starting at the same token never share a row). Like CascadePlanner, a plan is
reused while the key (the decode set) is unchanged."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import compress
from operator import itemgetter, ne

from kvloop.engine.cascade.plan import Worth, build_plan, common_run


class _Node:
    __slots__ = ("start", "end", "edge", "rows", "ends", "children", "shared")

    def __init__(self, start: int, edge: list[int], rows: set, ends: set, children: dict | None = None,
                 shared: dict | None = None):
        self.start, self.end, self.edge = start, start + len(edge), edge  # blocks [start, end), their ids
        self.rows = rows  # every row whose full blocks pass through start (its subtree's rows)
        self.ends = ends  # the rows whose full blocks end at `end`
        self.children: dict[int, _Node] = children if children is not None else {}  # by the block at `end`
        # the children that two or more rows pass through (the only ones a group can be found under): the plan
        # walks these, not every row's leaf
        self.shared: dict[int, _Node] = shared if shared is not None else {}


class ShapePlanner:
    """plan(key, tables, context_lens) -> [(members, shared tokens)], as CascadePlanner.plan then
    StepCost.group_shapes; key: one hashable identity per row (a row whose blocks changed in place is
    compared anew)."""

    def __init__(self, block_size: int, worth: Worth, nested: bool = True):
        self.block_size = block_size
        self.worth = worth
        self._worth: dict[tuple[int, int], bool] = {}  # worth's answers (a pure function of its two ints)
        self.nested = nested
        self._key: tuple | None = None
        self._shapes: list[tuple[int, int]] = []
        self._full: dict[Hashable, list[int]] = {}  # each row's full blocks, as the tree holds them
        # rows whose held blocks cannot change (see plan's `fixed`) -> how many they hold
        self._sealed: dict[Hashable, int] = {}
        self._end: dict[Hashable, _Node] = {}  # the node each row's blocks end at
        self._root = _Node(0, [], set(), set())
        self.builds = 0

    def plan(self, key: tuple, tables: Sequence[Sequence[int]], context_lens: Sequence[int],
             fixed: Sequence[int] | None = None) -> list[tuple[int, int]]:
        """fixed: per row, how many of its first blocks stay as they are while it keeps its identity (the KV
        manager's committed blocks); those are not compared again. None: every held block is compared."""
        if key == self._key:
            return self._shapes
        self._key = key
        self.builds += 1
        position = dict(zip(key, range(len(key)), strict=True)) if self.nested else {}
        if not self.nested or len(position) != len(key):
            # the prefix common to every row alone (one look at each row), or two rows with one identity
            self._full, self._sealed, self._end = {}, {}, {}
            self._root = _Node(0, [], set(), set())
            if not self.nested and self._nothing_common(tables, context_lens):
                self._shapes = []  # build_plan's answer, told without its walk (mixed traffic: most steps)
                return self._shapes
            plan = build_plan(tables, context_lens, self.block_size, self.worth, self.nested)
            self._shapes = [] if plan is None else [(len(g.rows), g.num_tokens) for g in plan.groups]
            return self._shapes
        self._update(key, tables, context_lens, fixed)
        self._shapes = self._groups(position)
        return self._shapes

    def _nothing_common(self, tables: Sequence[Sequence[int]], context_lens: Sequence[int]) -> bool:
        """Whether no full block is common to every row, so that the common scope has no group: fewer than two
        rows, a row with no full block, or two rows whose first blocks differ (told in C; the first and the last row
        first: in mixed traffic they mostly differ)."""
        if len(tables) < 2 or min(context_lens) <= self.block_size:
            return True
        return tables[0][0] != tables[-1][0] or len(set(map(itemgetter(0), tables))) > 1

    # ---- the tree ---------------------------------------------------------------------------------
    def _update(self, key: tuple, tables: Sequence[Sequence[int]], context_lens: Sequence[int],
                fixed: Sequence[int] | None) -> None:
        bs, held, sealed = self.block_size, self._full, self._sealed
        for row in held.keys() - key:  # rows that left
            self._remove(row, held.pop(row))
            sealed.pop(row, None)
        fulls = [(n - 1) // bs if n > 0 else 0 for n in context_lens]  # blocks filled before the step (build_plan's)
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
                    if have < full and (row in sealed or table[:have] == old) and self._grow(row, table, full):
                        pass  # its own leaf grew
                    else:
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
        node = self._root
        if not node.rows:
            self._root = self._end[row] = _Node(0, blocks[:], {row}, {row})
            return
        parent: _Node | None = None
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
                leaf = node.children[blocks[node.end]] = _Node(node.end, blocks[node.end :], {row}, {row})
                self._end[row] = leaf
                return
            parent, node = node, child

    def _split(self, node: _Node, at: int) -> None:
        """Cuts node's edge at `at`: the rest, with node's children and ending rows, becomes its only child."""
        cut = at - node.start
        tail = _Node(at, node.edge[cut:], set(node.rows), node.ends, node.children, node.shared)
        node.edge, node.end, node.ends, node.children = node.edge[:cut], at, set(), {tail.edge[0]: tail}
        node.shared = {tail.edge[0]: tail} if len(tail.rows) > 1 else {}
        for row in tail.ends:
            self._end[row] = tail

    def _remove(self, row: Hashable, blocks: list[int]) -> None:
        del self._end[row]
        path = []
        node = self._root
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
                    self._root = _Node(0, [], set(), set())
            elif not node.ends and len(node.children) == 1:  # nobody parts or ends here: one node with its child
                (child,) = node.children.values()
                node.edge, node.end = node.edge + child.edge, child.end
                node.ends, node.children, node.shared = child.ends, child.children, child.shared
                for moved in node.ends:
                    self._end[moved] = node

    # ---- the plan ---------------------------------------------------------------------------------
    def _groups(self, position: dict) -> list[tuple[int, int]]:
        bs, worth, known = self.block_size, self.worth, self._worth
        found: list[tuple[int, int, int, int]] = []  # (first token, first row, members, tokens)
        stack = [(self._root, 0)]
        while stack:
            node, covered = stack.pop()
            members = len(node.rows)
            if members < 2:
                continue
            if node.end > covered:
                shape = (members, (node.end - covered) * bs)
                pays = known.get(shape)
                if pays is None:
                    if len(known) >= 1 << 16:
                        known.clear()  # a bound for a long-lived planner (shapes are few in practice)
                    pays = known[shape] = worth(*shape)
                if pays:
                    found.append((covered * bs, min(map(position.__getitem__, node.rows)), *shape))
                    covered = node.end
            for child in node.shared.values():
                stack.append((child, covered))
        found.sort()
        return [(members, tokens) for _, _, members, tokens in found]
