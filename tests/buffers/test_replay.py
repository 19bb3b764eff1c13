"""BatchedReplayBuffer against a plain per-lane reference: storage, n-step windows, sampling, priorities, state."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_speed.buffers import BatchedReplayBuffer


def make_batch(rng: np.random.Generator, t: int, n: int, *, obs_shape: tuple = (3,), obs_dtype=np.float32,
               p_end: float = 0.25, p_invalid: float = 0.15, with_valid: bool = True) -> dict:
    """A [T, N] batch with random episode ends and invalid steps (no autoreset pattern assumed)."""
    if np.issubdtype(obs_dtype, np.integer):
        obs, next_obs = (rng.integers(0, 256, (t, n, *obs_shape)).astype(obs_dtype) for _ in range(2))
    else:
        obs, next_obs = (rng.standard_normal((t, n, *obs_shape)).astype(obs_dtype) for _ in range(2))
    batch = {"obs": obs, "next_obs": next_obs, "actions": rng.integers(0, 5, (t, n)),
             "rewards": rng.standard_normal((t, n)).astype(np.float32),
             "terminateds": rng.random((t, n)) < p_end / 2, "truncateds": rng.random((t, n)) < p_end / 2}
    if with_valid:
        batch["valid"] = rng.random((t, n)) >= p_invalid
    return batch


class Reference:
    """Every step ever written, per lane, as Python lists; the n-step rules as straightforward loops."""

    def __init__(self, slots_per_lane: int, num_lanes: int) -> None:
        self.slots_per_lane, self.num_lanes = slots_per_lane, num_lanes
        self.lanes: list[list[dict]] = [[] for _ in range(num_lanes)]

    def add(self, batch: dict, lane_start: int) -> None:
        t, n = batch["rewards"].shape
        valid = batch.get("valid", np.ones((t, n), bool))
        for step in range(t):
            for lane in range(n):
                self.lanes[lane_start + lane].append({
                    "obs": batch["obs"][step, lane], "next_obs": batch["next_obs"][step, lane],
                    "action": batch["actions"][step, lane], "reward": float(batch["rewards"][step, lane]),
                    "terminated": bool(batch["terminateds"][step, lane]),
                    "truncated": bool(batch["truncateds"][step, lane]), "valid": bool(valid[step, lane])})

    def live(self) -> list[tuple[int, int]]:
        """(lane, step) of every valid transition still stored: each lane keeps its last C steps."""
        return [(lane, s) for lane, steps in enumerate(self.lanes)
                for s in range(max(0, len(steps) - self.slots_per_lane), len(steps)) if steps[s]["valid"]]

    def slot(self, lane: int, step: int) -> int:
        return (step % self.slots_per_lane) * self.num_lanes + lane

    def nstep(self, lane: int, step: int, n_step: int, gamma: float) -> tuple[float, int, int]:
        """(discounted return, last step, steps used) of the window starting at a live valid step.

        Steps after a live step are never overwritten (a lane drops its oldest first), so what the buffer sees as a
        wrapped-around slot holding an older step shows up here as a step not written yet."""
        steps = self.lanes[lane]
        ret, last = 0.0, step
        for k in range(n_step):
            i = step + k
            if k > 0 and (i >= len(steps) or not steps[i]["valid"]):  # not yet written, or not a transition
                break
            ret += gamma ** k * steps[i]["reward"]
            last = i
            if steps[i]["terminated"] or steps[i]["truncated"]:
                break
        return ret, last, last - step + 1


def assert_matches_reference(buf: BatchedReplayBuffer, ref: Reference, n_step: int, gamma: float) -> None:
    live = ref.live()
    assert len(buf) == len(live)
    valid_slots = np.zeros(buf.capacity, bool)
    valid_slots[[ref.slot(lane, s) for lane, s in live]] = True
    # Exactly the live valid transitions can be sampled.
    np.testing.assert_array_equal(buf._tree.get(np.arange(buf.capacity)) > 0, valid_slots)
    if not live:
        return
    indices = np.array([ref.slot(lane, s) for lane, s in live])
    got = buf._nstep_for_indices(indices, n_step, gamma)
    expected = [ref.nstep(lane, s, n_step, gamma) for lane, s in live]
    np.testing.assert_allclose(got["rewards"], [e[0] for e in expected], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got["n_step"], [e[2] for e in expected])
    last_steps = [ref.lanes[lane][e[1]] for (lane, _), e in zip(live, expected)]
    np.testing.assert_array_equal(got["last_indices"],
                                  [ref.slot(lane, e[1]) for (lane, _), e in zip(live, expected)])
    np.testing.assert_array_equal(got["terminateds"], [s["terminated"] for s in last_steps])
    np.testing.assert_array_equal(buf._flat["next_obs"][got["last_indices"]], [s["next_obs"] for s in last_steps])
    np.testing.assert_array_equal(buf._flat["obs"][indices], [ref.lanes[lane][s]["obs"] for lane, s in live])
    np.testing.assert_array_equal(buf._flat["actions"][indices], [ref.lanes[lane][s]["action"] for lane, s in live])


def assert_states_equal(a: object, b: object) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for key in a:
            assert_states_equal(a[key], b[key])
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b


# ---------------------------------------------------------------------------------------------- n-step windows


def test_nstep_windows_by_hand() -> None:
    """One lane: terminated at step 2, an invalid (autoreset) step 3, truncated at step 5, C = 8."""
    t = 7
    steps = np.arange(t)[:, None]  # [T, N=1]
    batch = {"obs": steps[..., None].astype(np.float32), "next_obs": 100 + steps[..., None].astype(np.float32),
             "actions": np.zeros((t, 1), np.int64), "rewards": (steps + 1).astype(np.float32),
             "terminateds": steps == 2, "truncateds": steps == 5, "valid": steps != 3}
    buf = BatchedReplayBuffer(8, 1)
    buf.add_batch(batch)
    got = buf._nstep_for_indices(np.array([0, 1, 2, 4, 5, 6]), n_step=3, gamma=0.5)
    assert got["rewards"].tolist() == [1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3, 5 + 0.5 * 6, 6, 7]
    assert got["n_step"].tolist() == [3, 2, 1, 2, 1, 1]  # step 6: step 7 is not written yet
    assert got["terminateds"].tolist() == [True, True, True, False, False, False]  # truncation bootstraps
    assert buf._flat["next_obs"][got["last_indices"]].ravel().tolist() == [102, 102, 102, 105, 105, 106]
    assert len(buf) == 6


def test_nstep_stops_at_overwritten_and_wrapped_slots() -> None:
    """C = 4: after 6 steps, slots hold steps 4, 5, 2, 3; step 5's successor slot holds the older step 2."""
    rng = np.random.default_rng(0)
    batch = make_batch(rng, 6, 1, p_end=0.0, p_invalid=0.0)
    buf = BatchedReplayBuffer(4, 1)
    buf.add_batch(batch)
    ref = Reference(4, 1)
    ref.add(batch, 0)
    got = buf._nstep_for_indices(np.array([2, 3, 0, 1]), n_step=4, gamma=1.0)  # steps 2, 3, 4, 5
    assert got["n_step"].tolist() == [4, 3, 2, 1]
    np.testing.assert_allclose(got["rewards"], [batch["rewards"][s:6, 0].sum() for s in (2, 3, 4, 5)], rtol=1e-6)
    assert buf.get_metrics() == {"size": 4, "added": 6, "evicted": 2, "sampled": 0}
    for n_step in (1, 2, 4, 9):
        assert_matches_reference(buf, ref, n_step, 0.9)


def test_batch_longer_than_the_ring_keeps_its_last_steps() -> None:
    rng = np.random.default_rng(1)
    buf = BatchedReplayBuffer(6, 2)  # C = 3
    ref = Reference(3, 2)
    for t in (2, 7, 1):
        batch = make_batch(rng, t, 2)
        buf.add_batch(batch)
        ref.add(batch, 0)
        assert_matches_reference(buf, ref, 2, 0.9)
    assert buf.get_metrics()["added"] == sum(s["valid"] for lane in ref.lanes for s in lane)
    assert buf.get_metrics()["added"] - buf.get_metrics()["evicted"] == len(buf)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_matches_reference_under_random_writes(data: st.DataObject) -> None:
    """Random capacities (1, and fewer slots than lanes, included), lane groups, T (beyond C too), episode ends,
    invalid steps; then every stored transition's n-step window, and sampling beyond the stored size."""
    num_lanes = data.draw(st.integers(1, 6), label="num_lanes")
    # Half the time at most num_lanes: C = 1, each lane holds only its latest step.
    capacity = data.draw(st.one_of(st.integers(1, num_lanes), st.integers(1, 30)), label="capacity")
    cuts = sorted(data.draw(st.sets(st.integers(1, num_lanes - 1), max_size=2), label="cuts") if num_lanes > 1 else [])
    groups = list(zip([0, *cuts], [*cuts, num_lanes]))
    prioritized = data.draw(st.booleans(), label="prioritized")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    buf = BatchedReplayBuffer(capacity, num_lanes, prioritized=prioritized, seed=0)
    ref = Reference(buf.slots_per_lane, num_lanes)
    assert buf.capacity == buf.slots_per_lane * num_lanes >= capacity
    for _ in range(data.draw(st.integers(1, 8), label="batches")):
        lo, hi = data.draw(st.sampled_from(groups), label="group")
        t = data.draw(st.integers(0, 2 * buf.slots_per_lane + 2), label="T")
        batch = make_batch(rng, t, hi - lo, with_valid=data.draw(st.booleans(), label="with_valid"))
        buf.add_batch(batch, lane_start=lo)
        ref.add(batch, lo)
    for n_step in (1, 2, 3, 5):
        assert_matches_reference(buf, ref, n_step, 0.9)
    metrics = buf.get_metrics()
    assert metrics["added"] == sum(s["valid"] for lane in ref.lanes for s in lane)
    assert metrics["size"] == metrics["added"] - metrics["evicted"] == len(ref.live())
    if len(buf):
        sample = buf.sample(3 * len(buf) + 1, n_step=3, gamma=0.9)
        live_slots = {ref.slot(lane, s) for lane, s in ref.live()}
        assert set(sample["indices"].tolist()) <= live_slots
        assert sample["weights"].max() == 1.0 and (sample["weights"] > 0).all()
        assert buf.get_metrics()["sampled"] == 3 * len(buf) + 1


@pytest.mark.parametrize("capacity, num_lanes", [(1, 1), (3, 5), (5, 5)])
def test_one_slot_per_lane(capacity: int, num_lanes: int) -> None:
    """C = 1: every window is one step long, and each lane keeps only its latest step."""
    rng = np.random.default_rng(17)
    buf = BatchedReplayBuffer(capacity, num_lanes, prioritized=True, seed=0)
    ref = Reference(1, num_lanes)
    assert buf.slots_per_lane == 1 and buf.capacity == num_lanes
    for t, lo, hi in ((3, 0, num_lanes), (1, 0, 1), (4, 0, 1), (2, 1, num_lanes)):
        if hi > lo:
            batch = make_batch(rng, t, hi - lo)
            buf.add_batch(batch, lane_start=lo)
            ref.add(batch, lo)
            assert_matches_reference(buf, ref, 3, 0.9)
    if len(buf):
        assert (buf.sample(50, n_step=3)["n_step"] == 1).all()


def test_sample_columns_shapes_and_dtypes() -> None:
    rng = np.random.default_rng(2)
    buf = BatchedReplayBuffer(64, 4, prioritized=True, seed=0)
    buf.add_batch(make_batch(rng, 10, 4, obs_shape=(2, 5)))
    s = buf.sample(7, n_step=3)
    expected = {"obs": ((7, 2, 5), np.float32), "next_obs": ((7, 2, 5), np.float32), "actions": ((7,), np.int64),
                "rewards": ((7,), np.float32), "terminateds": ((7,), np.bool_), "n_step": ((7,), np.int64),
                "weights": ((7,), np.float32), "indices": ((7,), np.int64)}
    assert {k: (v.shape, v.dtype) for k, v in s.items()} == expected


def test_float_actions_are_stored_with_their_shape() -> None:
    rng = np.random.default_rng(3)
    batch = make_batch(rng, 5, 2)
    batch["actions"] = rng.standard_normal((5, 2, 3)).astype(np.float32)
    buf = BatchedReplayBuffer(10, 2, seed=0)
    buf.add_batch(batch)
    s = buf.sample(4)
    assert s["actions"].shape == (4, 3) and s["actions"].dtype == np.float32
    c, lane = np.divmod(s["indices"], 2)
    np.testing.assert_array_equal(s["actions"], batch["actions"][c, lane])


def test_uint8_obs_stay_uint8() -> None:
    rng = np.random.default_rng(4)
    batch = make_batch(rng, 6, 3, obs_shape=(4, 4), obs_dtype=np.uint8)
    buf = BatchedReplayBuffer(30, 3, seed=0)
    buf.add_batch(batch)
    assert buf._data["obs"].dtype == buf._data["next_obs"].dtype == np.uint8
    s = buf.sample(16, n_step=2)
    assert s["obs"].dtype == s["next_obs"].dtype == np.uint8
    c, lane = np.divmod(s["indices"], 3)
    np.testing.assert_array_equal(s["obs"], batch["obs"][c, lane])


# ------------------------------------------------------------------------------------- sampling and priorities

# chi-square critical values at p = 1e-6 (scipy.stats.chi2.ppf(1 - 1e-6, df)): a correct sampler fails one in a
# million seeds; the seeds are fixed, so these tests are deterministic.
CHI2_CRITICAL = {5: 35.888, 6: 38.258}


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    return float(((counts - expected) ** 2 / expected).sum())


def filled(capacity: int, num_lanes: int, valid: np.ndarray, **kwargs) -> BatchedReplayBuffer:
    """A buffer holding one [C, L] batch with the given valid mask and no episode ends."""
    rng = np.random.default_rng(5)
    batch = make_batch(rng, *valid.shape, p_end=0.0)
    batch["valid"] = valid
    buf = BatchedReplayBuffer(capacity, num_lanes, **kwargs)
    buf.add_batch(batch)
    return buf


def test_prioritized_sampling_follows_priority_to_the_alpha() -> None:
    valid = np.array([[True, True], [False, True], [True, True], [True, False]])  # [C=4, L=2]
    alpha, eps = 0.6, 1e-6
    buf = filled(8, 2, valid, prioritized=True, alpha=alpha, eps=eps, seed=7)
    priorities = np.array([0.5, 1.0, 9.0, 2.0, 3.0, 0.25, 4.0, 7.0])  # by flat slot c * L + l
    buf.update_priorities(np.arange(8), priorities)
    probs = np.where(valid.ravel(), (priorities + eps) ** alpha, 0.0)
    probs /= probs.sum()
    n = 200_000
    counts = np.bincount(buf.sample(n)["indices"], minlength=8)
    assert counts[~valid.ravel()].sum() == 0  # invalid slots (priorities 9 and 7 passed in) are never drawn
    assert chi_square(counts[valid.ravel()], probs[valid.ravel()]) < CHI2_CRITICAL[5]


def test_prioritized_sampling_in_a_deep_tree() -> None:
    """4096 slots: the sum tree descends below its binary-searched level; chi-square over ~3600 slots, against the
    Wilson-Hilferty approximation of the p = 1e-6 critical value."""
    rng = np.random.default_rng(18)
    valid = rng.random((1024, 4)) < 0.9
    buf = filled(4096, 4, valid, prioritized=True, alpha=0.6, seed=19)
    priorities = rng.uniform(0.5, 2.0, 4096)
    buf.update_priorities(np.arange(4096), priorities)
    probs = np.where(valid.ravel(), (priorities + 1e-6) ** 0.6, 0.0)
    probs /= probs.sum()
    counts = np.bincount(buf.sample(400_000)["indices"], minlength=4096)
    assert counts[~valid.ravel()].sum() == 0
    df = valid.sum() - 1
    critical = df * (1 - 2 / (9 * df) + 4.753 * np.sqrt(2 / (9 * df))) ** 3
    assert chi_square(counts[valid.ravel()], probs[valid.ravel()]) < critical


def test_uniform_sampling_is_uniform_over_valid_slots() -> None:
    valid = np.array([[True, False, True], [True, True, True], [False, True, True]])  # [C=3, L=3]
    buf = filled(9, 3, valid, seed=8)
    counts = np.bincount(buf.sample(200_000)["indices"], minlength=9)
    assert counts[~valid.ravel()].sum() == 0
    assert chi_square(counts[valid.ravel()], np.full(7, 1 / 7)) < CHI2_CRITICAL[6]


def test_importance_weights_follow_the_formula() -> None:
    valid = np.ones((5, 2), bool)
    valid[2, 1] = False
    alpha, eps = 0.7, 0.01
    buf = filled(10, 2, valid, prioritized=True, alpha=alpha, beta=0.4, eps=eps, seed=9)
    priorities = np.linspace(0.1, 3.0, 10)
    buf.update_priorities(np.arange(10), priorities)
    p = np.where(valid.ravel(), (priorities + eps) ** alpha, 0.0)
    probs = p / p.sum()
    for beta in (None, 0.0, 1.0):
        s = buf.sample(256, beta=beta)
        raw = (valid.sum() * probs[s["indices"]]) ** -(0.4 if beta is None else beta)
        np.testing.assert_allclose(s["weights"], raw / raw.max(), rtol=1e-6)
    uniform = filled(10, 2, valid, seed=9)
    assert (uniform.sample(32)["weights"] == 1.0).all()


def test_buffer_wide_importance_weights_divide_by_the_largest_weight_any_stored_transition_gets() -> None:
    """``importance_weights="buffer"`` (RLlib's and OpenAI baselines' normalization): the divisor comes from the
    smallest priority in the whole buffer, so a batch without that transition has no weight of 1."""
    valid = np.ones((5, 2), bool)
    valid[2, 1] = False  # an invalid slot has priority 0 and must not count as the smallest
    buf = filled(10, 2, valid, prioritized=True, alpha=0.7, beta=0.4, eps=0.01, importance_weights="buffer", seed=9)
    priorities = np.linspace(0.1, 3.0, 10)
    buf.update_priorities(np.arange(10), priorities)
    p = np.where(valid.ravel(), (priorities + 0.01) ** 0.7, 0.0)
    smallest = p[p > 0].min()
    for beta in (0.4, 1.0):
        s = buf.sample(256, beta=beta)
        np.testing.assert_allclose(s["weights"], (smallest / p[s["indices"]]) ** beta, rtol=1e-6)
    before = buf.sample(4096, beta=0.4)["weights"].mean()
    buf.update_priorities(np.array([0]), np.array([1e-4]))  # one tiny TD error scales every weight down
    assert buf.sample(4096, beta=0.4)["weights"].mean() < 0.7 * before


def test_new_transitions_get_the_max_priority() -> None:
    rng = np.random.default_rng(10)
    alpha = 0.5
    buf = BatchedReplayBuffer(8, 1, prioritized=True, alpha=alpha, eps=0.0, seed=0)
    buf.add_batch(make_batch(rng, 2, 1, p_invalid=0.0))
    assert buf._tree.get(np.arange(2)).tolist() == [1.0, 1.0]  # initial max priority 1
    buf.update_priorities(np.array([0, 1]), np.array([4.0, 0.25]))
    buf.add_batch(make_batch(rng, 1, 1, p_invalid=0.0))
    assert buf._tree.get(np.arange(3)).tolist() == [2.0, 0.5, 2.0]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_tree_holds_exactly_the_priorities_of_any_add_update_sequence(data: st.DataObject) -> None:
    """The sum tree's leaves against priorities tracked here by hand: max priority ** alpha for new valid steps,
    0 for invalid ones, (p + eps) ** alpha after update_priorities unless the slot has since become invalid."""
    num_lanes = data.draw(st.integers(1, 4), label="num_lanes")
    capacity = data.draw(st.integers(1, 24), label="capacity")
    alpha = data.draw(st.sampled_from([0.0, 0.6, 1.0]), label="alpha")
    eps = 1e-3
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    buf = BatchedReplayBuffer(capacity, num_lanes, prioritized=True, alpha=alpha, eps=eps, seed=1)
    c, lanes = buf.slots_per_lane, num_lanes
    expected = np.zeros(buf.capacity)
    valid_now = np.zeros(buf.capacity, bool)
    steps_written, max_priority, pending = 0, 1.0, None
    for _ in range(data.draw(st.integers(1, 10), label="ops")):
        if data.draw(st.booleans(), label="add") or not valid_now.any():
            t = data.draw(st.integers(1, 2 * c + 1), label="T")
            batch = make_batch(rng, t, lanes)
            buf.add_batch(batch)
            for step in range(t):
                for lane in range(lanes):
                    slot = ((steps_written + step) % c) * lanes + lane
                    valid_now[slot] = batch["valid"][step, lane]
                    expected[slot] = max_priority ** alpha if valid_now[slot] else 0.0
            steps_written += t
        else:
            if pending is None or data.draw(st.booleans(), label="fresh"):
                pending = buf.sample(data.draw(st.integers(1, 20), label="B"))["indices"]
            priorities = rng.random(len(pending)) * 5
            buf.update_priorities(pending, priorities)  # possibly after adds overwrote some of these slots
            for slot, p in zip(pending, priorities):
                expected[slot] = (p + eps) ** alpha if valid_now[slot] else 0.0
            max_priority = max(max_priority, priorities.max() + eps)
        np.testing.assert_allclose(buf._tree.get(np.arange(buf.capacity)), expected, rtol=1e-12)
        assert buf._tree.total() == pytest.approx(expected.sum(), rel=1e-12)


def test_uniform_buffer_update_priorities_is_a_checked_no_op() -> None:
    buf = filled(4, 1, np.ones((4, 1), bool), seed=0)
    before = buf.get_state()
    buf.update_priorities(np.array([0, 1]), np.array([5.0, 0.0]))
    assert_states_equal(buf.get_state(), before)
    with pytest.raises(ValueError, match="priorities"):
        buf.update_priorities(np.array([0]), np.array([-1.0]))


# -------------------------------------------------------------------------------------------------- state


@pytest.mark.parametrize("prioritized", [False, True])
def test_state_round_trip_restores_samples_and_metrics(prioritized: bool) -> None:
    rng = np.random.default_rng(11)
    a = BatchedReplayBuffer(40, 4, prioritized=prioritized, seed=3)
    a.add_batch(make_batch(rng, 7, 2), lane_start=0)
    a.add_batch(make_batch(rng, 12, 2), lane_start=2)
    a.update_priorities(a.sample(16, n_step=2)["indices"], rng.random(16))
    state = pickle.loads(pickle.dumps(a.get_state()))
    b = BatchedReplayBuffer(40, 4, prioritized=prioritized)
    b.set_state(state)
    assert b.get_metrics() == a.get_metrics() and len(b) == len(a)
    more = make_batch(rng, 9, 2)
    for buf in (a, b):
        buf.add_batch(more, lane_start=0)
    sa, sb = a.sample(64, n_step=3), b.sample(64, n_step=3)
    assert_states_equal(sa, sb)
    assert b.get_metrics() == a.get_metrics()
    assert_states_equal(a.get_state(), b.get_state())
    a.add_batch(make_batch(rng, 3, 2), lane_start=0)  # the state was a copy: later writes don't reach it
    assert state["lane_steps"].tolist() == [7, 7, 12, 12]


def test_state_of_an_empty_buffer_and_mismatched_layouts() -> None:
    empty = BatchedReplayBuffer(10, 2).get_state()
    buf = BatchedReplayBuffer(10, 2)
    buf.set_state(empty)
    assert len(buf) == 0
    buf.add_batch(make_batch(np.random.default_rng(12), 3, 2))
    assert len(buf) > 0
    for other in (BatchedReplayBuffer(12, 2), BatchedReplayBuffer(10, 5),
                  BatchedReplayBuffer(10, 2, prioritized=True)):
        with pytest.raises(ValueError, match="capacity|num_lanes|prioritized"):
            other.set_state(empty)


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, match", [
    ({"capacity": 0}, r"`capacity` must be >= 1, got 0"),
    ({"num_lanes": 0}, r"`num_lanes` must be >= 1, got 0"),
    ({"alpha": -0.5}, r"`alpha` must be >= 0, got -0.5"),
    ({"beta": 1.5}, r"`beta` must be in \[0, 1\], got 1.5"),
    ({"beta": -0.1}, r"`beta` must be in \[0, 1\], got -0.1"),
    ({"eps": -1.0}, r"`eps` must be finite and >= 0, got -1.0"),
    ({"importance_weights": "global"}, r"`importance_weights`='global' must be one of 'batch', 'buffer'"),
])
def test_constructor_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BatchedReplayBuffer(**{"capacity": 10, "num_lanes": 2, **kwargs})


def _without(batch: dict, key: str) -> dict:
    return {k: v for k, v in batch.items() if k != key}


@pytest.mark.parametrize("change, match", [
    (lambda b: _without(b, "rewards"), r"missing columns \['rewards'\]"),
    (lambda b: {**b, "infos": b["rewards"]}, r"unknown columns \['infos'\]"),
    (lambda b: {**b, "rewards": b["rewards"][0]}, r"'rewards' has shape \(2,\)"),
    (lambda b: {**b, "actions": b["actions"][:, :1]}, r"'actions' has shape \(4, 1\)"),
    (lambda b: {**b, "terminateds": b["terminateds"][..., None]}, r"'terminateds' has shape \(4, 2, 1\)"),
    (lambda b: {**b, "obs": b["obs"][..., :2]}, r"'obs' has per-step shape \(2,\) .* stores per-step shape \(3,\)"),
    (lambda b: {**b, "obs": b["obs"].astype(np.float64)}, r"'obs' .* dtype float64, but the buffer stores .* float32"),
    (lambda b: {**b, "next_obs": b["next_obs"][..., :1]}, r"'next_obs' has per-step shape \(1,\)"),
    (lambda b: {**b, "actions": b["actions"].astype(np.int32)}, r"'actions' .* int32, but the buffer stores .* int64"),
    (lambda b: {**b, "truncateds": b["truncateds"].astype(np.int8)}, r"'truncateds' must be bool, got int8"),
    (lambda b: {**b, "valid": b["valid"].astype(np.float32)}, r"'valid' must be bool"),
    (lambda b: {**b, "rewards": b["rewards"].astype(np.complex64)}, r"'rewards' must be real numbers"),
])
def test_rejected_batches_change_nothing(change, match: str) -> None:
    rng = np.random.default_rng(13)
    buf = BatchedReplayBuffer(20, 4, prioritized=True, seed=0)
    buf.add_batch(make_batch(rng, 4, 2), lane_start=0)
    before = buf.get_state()
    with pytest.raises(ValueError, match=match):
        buf.add_batch(change(make_batch(rng, 4, 2)), lane_start=0)
    assert_states_equal(buf.get_state(), before)


def test_first_batch_needs_next_obs_like_obs() -> None:
    rng = np.random.default_rng(14)
    batch = make_batch(rng, 3, 2)
    batch["next_obs"] = batch["next_obs"].astype(np.float64)
    buf = BatchedReplayBuffer(10, 2)
    with pytest.raises(ValueError, match=r"'next_obs' .* float64, but 'obs' has .* float32"):
        buf.add_batch(batch)
    assert "obs" not in buf._data


def test_lane_range_and_cursor_checks() -> None:
    rng = np.random.default_rng(15)
    buf = BatchedReplayBuffer(20, 4)
    with pytest.raises(ValueError, match=r"`lane_start`=3, 5\) must lie in \[0, num_lanes=4\)"):
        buf.add_batch(make_batch(rng, 2, 2), lane_start=3)
    with pytest.raises(ValueError, match=r"`lane_start`=-1"):
        buf.add_batch(make_batch(rng, 2, 2), lane_start=-1)
    buf.add_batch(make_batch(rng, 2, 2), lane_start=0)
    before = buf.get_state()
    with pytest.raises(ValueError, match=r"lanes \[1, 3\) are at different write cursors \[0, 2\]"):
        buf.add_batch(make_batch(rng, 2, 2), lane_start=1)
    assert_states_equal(buf.get_state(), before)


def test_sample_and_update_priorities_reject_bad_arguments() -> None:
    rng = np.random.default_rng(16)
    buf = BatchedReplayBuffer(20, 2, prioritized=True, seed=0)
    with pytest.raises(ValueError, match="holds no valid transitions"):
        buf.sample(4)
    buf.add_batch(make_batch(rng, 1, 2, with_valid=False) | {"valid": np.zeros((1, 2), bool)})
    with pytest.raises(ValueError, match="holds no valid transitions"):  # stored, but none valid
        buf.sample(4)
    buf.add_batch(make_batch(rng, 5, 2, with_valid=False))
    with pytest.raises(ValueError, match=r"`n_step` must be >= 1, got 0"):
        buf.sample(4, n_step=0)
    with pytest.raises(ValueError, match=r"`batch_size` must be >= 1, got 0"):
        buf.sample(0)
    with pytest.raises(ValueError, match=r"`beta` must be in \[0, 1\], got 2"):
        buf.sample(4, beta=2)
    zero = BatchedReplayBuffer(4, 1, prioritized=True, eps=0.0)
    zero.add_batch(make_batch(rng, 2, 1, with_valid=False))
    zero.update_priorities(np.array([0, 1]), np.zeros(2))
    with pytest.raises(ValueError, match="priority 0"):
        zero.sample(1)
    before = buf.get_state()
    for priorities, match in (([np.nan], "priorities"), ([-0.5], "priorities"), ([np.inf], "priorities")):
        with pytest.raises(ValueError, match=f"`{match}` must be finite and >= 0"):
            buf.update_priorities(np.array([0]), np.array(priorities))
    with pytest.raises(ValueError, match=r"`indices` must lie in \[0, 20\), got \[0, 20\]"):
        buf.update_priorities(np.array([0, 20]), np.array([1.0, 1.0]))
    with pytest.raises(ValueError, match=r"`indices` must lie in \[0, 20\), got \[-1, -1\]"):
        buf.update_priorities(np.array([-1]), np.array([1.0]))
    with pytest.raises(ValueError, match=r"`indices` must be integers"):
        buf.update_priorities(np.array([0.0]), np.array([1.0]))
    with pytest.raises(ValueError, match=r"1-D of equal length"):
        buf.update_priorities(np.array([0, 1]), np.array([1.0]))
    assert_states_equal(buf.get_state(), before)
