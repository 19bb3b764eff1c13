"""SumTree against plain numpy: totals and parent sums after any updates, prefix search against searchsorted."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_speed.buffers import SumTree

# Capacities on both sides of the tree's internal switches: search level (1024 nodes), whole-level recompute
# (8192 nodes below the leaves' parents), and parent deduplication (> 4096 updated nodes).
CAPACITIES = st.sampled_from([1, 2, 3, 5, 64, 1000, 1025, 3000, 20_000, 40_000])


def leaves(tree: SumTree) -> np.ndarray:
    return tree.get(np.arange(tree.capacity))


def assert_consistent(tree: SumTree, expected: np.ndarray) -> None:
    """Leaves as expected, every parent exactly the float sum of its children, total the sum of leaves."""
    np.testing.assert_array_equal(leaves(tree), expected)
    t = tree.get_state()["tree"]
    first_leaf = len(t) // 2
    np.testing.assert_array_equal(t[1:first_leaf], t[2:2 * first_leaf:2] + t[3:2 * first_leaf:2])
    assert tree.total() == pytest.approx(expected.sum(), rel=1e-12, abs=0.0)


@settings(max_examples=100, deadline=None)
@given(capacity=CAPACITIES, data=st.data())
def test_total_and_parents_after_random_updates(capacity: int, data: st.DataObject) -> None:
    tree = SumTree(capacity)
    expected = np.zeros(capacity)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    for _ in range(data.draw(st.integers(1, 6), label="updates")):
        size = data.draw(st.sampled_from([1, 7, 300, 5000]), label="size")
        # Few distinct indices force duplicates, sorted unique indices take the no-sort path.
        kind = data.draw(st.sampled_from(["random", "duplicates", "sorted"]), label="kind")
        if kind == "random":
            idx = rng.integers(0, capacity, size)
        elif kind == "duplicates":
            idx = rng.choice(rng.integers(0, capacity, 3), size)
        else:
            idx = np.unique(rng.integers(0, capacity, size))
        values = rng.random(len(idx)) * rng.choice([0.0, 1e-9, 1.0, 1e6], len(idx))
        tree.update(idx, values)
        for i, v in zip(idx, values):  # plain loop: the last write to an index wins
            expected[i] = v
        assert_consistent(tree, expected)


def test_duplicate_indices_last_write_wins() -> None:
    tree = SumTree(8)
    tree.update(np.array([3, 3, 5, 3]), np.array([1.0, 2.0, 4.0, 7.0]))
    assert tree.get(np.array([3, 5])).tolist() == [7.0, 4.0]
    assert tree.total() == 11.0


@settings(max_examples=100, deadline=None)
@given(capacity=CAPACITIES, zero_fraction=st.sampled_from([0.0, 0.5, 0.99]), seed=st.integers(0, 2**32 - 1))
def test_find_prefix_matches_searchsorted_exactly_on_integer_leaves(capacity: int, zero_fraction: float,
                                                                     seed: int) -> None:
    """Integer leaves make every partial sum exact, so tree and cumsum must agree on every u, boundaries included."""
    rng = np.random.default_rng(seed)
    values = rng.integers(1, 100, capacity).astype(np.float64) * (rng.random(capacity) >= zero_fraction)
    values[rng.integers(capacity)] = 5.0  # at least one positive leaf
    tree = SumTree(capacity)
    tree.update(np.arange(capacity), values)
    cumsum = np.cumsum(values)
    total = cumsum[-1]
    boundaries = np.unique(cumsum[cumsum < total])
    u = np.concatenate([rng.random(2000) * total, boundaries[:500], np.nextafter(boundaries[:500], 0), [0.0]])
    found = tree.find_prefix(u)
    np.testing.assert_array_equal(found, np.searchsorted(cumsum, u, side="right"))
    assert (values[found] > 0).all()


@settings(max_examples=40, deadline=None)
@given(capacity=CAPACITIES, seed=st.integers(0, 2**32 - 1))
def test_find_prefix_on_float_leaves_lands_in_the_right_interval(capacity: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.random(capacity) ** 4 * (rng.random(capacity) < 0.7)
    values[0] = 0.5
    tree = SumTree(capacity)
    tree.update(np.arange(capacity), values)
    cumsum = np.cumsum(values)
    u = rng.random(3000) * tree.total()
    found = tree.find_prefix(u)
    assert (values[found] > 0).all()
    tolerance = 1e-9 * cumsum[-1]  # the tree sums in a different order than cumsum
    lower = np.where(found > 0, cumsum[found - 1], 0.0)
    assert (lower - tolerance <= u).all() and (u < cumsum[found] + tolerance).all()
    np.testing.assert_array_equal(found, np.searchsorted(cumsum, u, side="right"))  # holds away from boundaries


def test_find_prefix_never_returns_zero_leaves_near_boundaries() -> None:
    capacity = 5000
    values = np.zeros(capacity)
    # Positive leaves right before long zero runs and at block edges; one too small to move the prefix sums.
    values[[0, 17, 1023, 1024, 2046, 4999]] = [0.1, 0.2, 1e-300, 0.3, 0.05, 0.7]
    tree = SumTree(capacity)
    tree.update(np.arange(capacity), values)
    cumsum = np.cumsum(values)
    near = np.concatenate([cumsum, np.nextafter(cumsum, 0), np.nextafter(cumsum, np.inf), [-1.0, 5.0, np.inf]])
    assert (values[tree.find_prefix(near)] > 0).all()


def test_find_prefix_clips_u_into_range() -> None:
    tree = SumTree(6)
    tree.update(np.arange(6), np.array([0.0, 1.0, 2.0, 0.0, 3.0, 0.0]))
    u = np.array([-5.0, 0.0, 6.0, 100.0])
    assert tree.find_prefix(u).tolist() == [1, 1, 4, 4]
    assert u.tolist() == [-5.0, 0.0, 6.0, 100.0]  # the caller's array is left alone
    inside = np.array([0.5, 2.5, 5.5])
    tree.find_prefix(inside)
    assert inside.tolist() == [0.5, 2.5, 5.5]


def test_rounding_overshoot_is_redone_with_the_guard() -> None:
    """A search-level node whose stored sum exceeds its children's (an exaggerated rounding error) sends the
    unguarded descent past its last positive leaf; find_prefix must notice and redo that draw guarded."""
    tree = SumTree(2048)  # 1024 search-level nodes, one level below them
    tree.update(np.arange(2048), np.r_[1.0, np.zeros(2047)])
    state = tree.get_state()
    state["tree"][1024] = 2.0  # children: leaf 0 = 1.0, leaf 1 = 0.0
    tree.set_state(state)
    assert tree._descend(np.array([1024]), np.array([1.5]), guarded=False).tolist() == [2049]  # the zero leaf
    assert tree.find_prefix(np.array([1.5])).tolist() == [0]


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="capacity"):
        SumTree(0)
    tree = SumTree(4)
    with pytest.raises(ValueError, match="empty"):
        tree.find_prefix(np.array([0.0]))
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 4\)"):
        tree.update(np.array([4]), np.array([1.0]))
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 4\)"):
        tree.update(np.array([-1]), np.array([1.0]))
    for bad in (-1.0, np.nan, np.inf):
        with pytest.raises(ValueError, match="finite and >= 0"):
            tree.update(np.array([0]), np.array([bad]))
    with pytest.raises(ValueError, match="2 indices but 1 values"):
        tree.update(np.array([0, 1]), np.array([1.0]))
    assert tree.total() == 0.0  # nothing was written
    tree.update(np.array([1]), np.array([1.0]))
    with pytest.raises(ValueError, match="NaN"):
        tree.find_prefix(np.array([0.5, np.nan]))
    with pytest.raises(ValueError, match="capacity"):
        SumTree(8).set_state(tree.get_state())
