"""A sum tree whose updates and prefix searches run as whole-array numpy operations, one loop step per tree level.

Prioritized replay updates and samples a few hundred leaves at a time; a per-item Python loop (RLlib's segment tree)
costs far more than the arithmetic, so every method here works on index arrays at once.
"""

from __future__ import annotations

import math

import numpy as np

#: For a few hundred items, numpy's per-call overhead, not arithmetic, sets the cost of a tree level (~5 us for the
#: ~6 calls of a fancy-indexed level). So ``update`` recomputes levels of up to this many nodes whole, with one
#: strided add each (8192 adds take ~3 us) ...
_WHOLE_LEVEL_NODES = 8192
#: ... and ``find_prefix`` replaces the top levels, down to the one with this many nodes, by one cumulative sum and
#: one binary search over that level (~25 us for the ten levels above 1024 nodes; cumsum costs ~3 ns a node).
_SEARCH_LEVEL_NODES = 1024
#: ``update`` drops repeated parents only when more nodes than this change (a whole ``add_batch``); for fewer,
#: writing a parent twice with the same sum costs less than finding the repeats.
_DEDUP_MIN = 4096


class SumTree:
    """Complete binary tree in one float64 array of size 2P (P = next power of two >= capacity).

    Node i has children 2i and 2i + 1; the root is node 1 (node 0 is unused); leaf j is node P + j. Every parent
    holds exactly the float sum of its two children, so a node is positive exactly when a leaf below it is: what
    keeps ``find_prefix``'s guarded descent off zero leaves.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"SumTree: `capacity` must be >= 1, got {capacity}.")
        self.capacity = int(capacity)
        self._depth = (self.capacity - 1).bit_length()  # levels below the root; P = 2**depth
        self._first_leaf = 1 << self._depth
        self._tree = np.zeros(2 * self._first_leaf)
        # The same memory as (left, right) child pairs: pair i = (tree[2i], tree[2i + 1]) holds node i's children, so
        # one gather fetches both (one numpy call, one cache line) where two would cost twice the call overhead.
        self._children = self._tree.view(np.complex128)
        # Level j has 2**j nodes; the leaves are level depth. update() propagates by fancy indexing into levels
        # deeper than whole_level and recomputes whole levels from there up (as parents, left and right views).
        whole_level = min(self._depth - 1, _WHOLE_LEVEL_NODES.bit_length() - 1)
        self._fancy_levels = self._depth - 1 - whole_level
        t = self._tree
        self._whole_levels = [(t[1 << j:2 << j], t[2 << j:4 << j:2], t[(2 << j) + 1:4 << j:2])
                              for j in reversed(range(whole_level + 1))]
        # find_prefix() binary-searches the prefix sums of level search_level, then descends level by level.
        self._search_level = min(self._depth, _SEARCH_LEVEL_NODES.bit_length() - 1)

    def total(self) -> float:
        """Sum of all leaves."""
        return float(self._tree[1])

    def min_positive(self) -> float:
        """The smallest positive leaf (inf if none): one pass over the leaves, O(capacity)."""
        leaves = self._tree[self._first_leaf:self._first_leaf + self.capacity]
        positive = leaves[leaves > 0.0]
        return float(positive.min()) if positive.size else math.inf

    def get(self, idx: np.ndarray) -> np.ndarray:
        """Leaf values at ``idx`` (in ``[0, capacity)``; unchecked, as it serves every prioritized sample)."""
        return self._tree[np.asarray(idx) + self._first_leaf]

    def update(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Sets leaves ``idx`` to ``values`` (for a repeated index the last value wins) and recomputes their parents.

        Raises ``ValueError`` for indices outside ``[0, capacity)`` or values that are negative, NaN or infinite.
        """
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        if idx.shape != values.shape:
            raise ValueError(f"SumTree.update: {idx.size} indices but {values.size} values.")
        if idx.size == 0:
            return
        if idx.min() < 0 or idx.max() >= self.capacity:
            raise ValueError(f"SumTree.update: indices must lie in [0, {self.capacity}); got "
                             f"[{idx.min()}, {idx.max()}].")
        if not (values.min() >= 0.0 and np.isfinite(values.max())):
            raise ValueError("SumTree.update: values must be finite and >= 0; got "
                             f"min {values.min()}, max {values.max()}.")
        self._assign(idx, values)

    def _assign(self, idx: np.ndarray, values: np.ndarray) -> None:
        """``update`` without its checks, for callers that have already made them."""
        t = self._tree
        nodes = idx + self._first_leaf
        t[nodes] = values  # numpy assigns repeated indices in order: the last value wins
        for _ in range(self._fancy_levels):
            nodes >>= 1
            if nodes.size > _DEDUP_MIN:
                # Drops a parent equal to its neighbour: for sorted indices (add_batch's) that is every repeat, so
                # the arrays halve per level; for others some repeats stay, harmless, and no O(n log n) sort is paid.
                nodes = nodes[np.concatenate(([True], nodes[1:] != nodes[:-1]))]
            children = self._children[nodes]
            t[nodes] = children.real + children.imag  # a repeated parent gets the same sum each time
        for parents, left, right in self._whole_levels:
            np.add(left, right, out=parents)

    def find_prefix(self, u: np.ndarray) -> np.ndarray:
        """For each ``u``, the leaf j with ``sum(leaves[:j]) <= u < sum(leaves[:j + 1])``; never a zero leaf.

        ``u`` is clipped into ``[0, total)``; the result agrees with
        ``np.searchsorted(np.cumsum(leaves), u, side="right")`` up to float rounding of the partial sums.
        """
        u = np.asarray(u, dtype=np.float64)
        t = self._tree
        first = 1 << self._search_level
        bounds = np.zeros(first + 1)  # [first + 1]: prefix sums of the search level's nodes
        np.cumsum(t[first:2 * first], out=bounds[1:])
        if not bounds[-1] > 0.0:
            raise ValueError("SumTree.find_prefix: the tree is empty (all leaves are 0).")
        if u.size == 0:
            return np.zeros(u.shape, np.int64)
        top = np.nextafter(bounds[-1], 0.0)
        low, high = u.min(), u.max()  # two reductions: cheaper than isnan().any() plus an unconditional clip
        if np.isnan(low):
            raise ValueError("SumTree.find_prefix: `u` contains NaN.")
        if low < 0.0 or high > top:
            u = np.minimum(np.maximum(u, 0.0), top)
        j = np.searchsorted(bounds, u, side="right") - 1  # bounds[j] <= u < bounds[j + 1], so node j is > 0
        leaves = self._descend(j + first, u - bounds[j], guarded=False)
        # Float rounding can carry u past the end of a subtree whose last leaves are 0 and so end on one of those;
        # checking once at the end is cheaper than guarding every level, and the rare misses are redone guarded.
        missed = t[leaves] == 0.0
        if missed.any():
            j = j[missed]
            leaves[missed] = self._descend(j + first, u[missed] - bounds[j], guarded=True)
        return leaves - self._first_leaf

    def _descend(self, nodes: np.ndarray, u: np.ndarray, guarded: bool) -> np.ndarray:
        """Leaf nodes reached from search-level ``nodes`` [B] for offsets ``u`` [B] within them, one step per level
        (both arrays are updated in place). ``guarded`` goes right only into a positive right child: when rounding
        has made u reach the node's sum, the left child (then equal to the node's sum) is the positive one."""
        for _ in range(self._depth - self._search_level):
            children = self._children[nodes]
            left = children.real
            go_right = u >= left
            if guarded:
                go_right &= children.imag > 0.0
            u -= left * go_right
            nodes <<= 1
            nodes += go_right
        return nodes

    def get_state(self) -> dict:
        """A copy of the tree array (with its capacity), for checkpoints."""
        return {"capacity": self.capacity, "tree": self._tree.copy()}

    def set_state(self, state: dict) -> None:
        """Restores ``get_state()``'s output; the capacity must match."""
        if state["capacity"] != self.capacity:
            raise ValueError(f"SumTree.set_state: state has capacity {state['capacity']}, this tree {self.capacity}.")
        self._tree[:] = state["tree"]  # in place: the level views keep pointing at the tree
