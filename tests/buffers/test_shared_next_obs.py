"""BatchedReplayBuffer's shared form (obs with T + 1 rows, no next_obs): each frame stored once, samples equal to the
stored form's for the same data, and a lane that does not continue loses only the transition it makes unknowable."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_speed.buffers import BatchedReplayBuffer


def _stream(rng, batches: int, t: int, n: int, continuing: bool = True) -> list[dict]:
    """Column batches as an env runner makes them: obs [T + 1, N] continuing from batch to batch, random ends."""
    out, last = [], rng.integers(0, 256, (n, 2, 3), dtype=np.uint8)
    for _ in range(batches):
        obs = np.concatenate([last[None], rng.integers(0, 256, (t, n, 2, 3), dtype=np.uint8)])
        out.append({"obs": obs, "actions": rng.integers(0, 5, (t, n)),
                    "rewards": rng.standard_normal((t, n)).astype(np.float32),
                    "terminateds": rng.random((t, n)) < 0.08, "truncateds": rng.random((t, n)) < 0.08,
                    "valid": rng.random((t, n)) >= 0.1})
        last = obs[-1] if continuing else rng.integers(0, 256, (n, 2, 3), dtype=np.uint8)
    return out


def _stored_form(batch: dict) -> dict:
    return {**batch, "obs": batch["obs"][:-1], "next_obs": batch["obs"][1:]}


@pytest.mark.parametrize("capacity, t, prioritized, device", [
    (96, 8, False, None),      # wraps around many times
    (1000, 5, True, None),     # never wraps
    (48, 20, True, None),      # T > C per lane: only the last C steps of a batch fit
    (64, 8, True, "cuda"),
])
def test_samples_equal_the_stored_form(capacity, t, prioritized, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    rng = np.random.default_rng(0)
    shared = BatchedReplayBuffer(capacity, num_lanes=4, prioritized=prioritized, seed=1, device=device)
    stored = BatchedReplayBuffer(capacity, num_lanes=4, prioritized=prioritized, seed=1, device=device)
    for i, batch in enumerate(_stream(rng, 12, t, 2) + _stream(rng, 12, t, 2)):
        lane_start = 0 if i < 12 else 2  # two runners' lane groups
        shared.add_batch(batch, lane_start=lane_start)
        stored.add_batch(_stored_form(batch), lane_start=lane_start)
        assert len(shared) == len(stored)
        for n_step in (1, 3):
            a, b = shared.sample(64, n_step=n_step), stored.sample(64, n_step=n_step)
            for key in b:
                x, y = (v.cpu().numpy() if hasattr(v, "cpu") else v for v in (a[key], b[key]))
                np.testing.assert_array_equal(x, y, err_msg=key)
    assert "next_obs" not in shared._data and "next_obs" in stored._data


def test_frames_are_stored_once():
    shared = BatchedReplayBuffer(1000, num_lanes=4)
    stored = BatchedReplayBuffer(1000, num_lanes=4)
    batch = _stream(np.random.default_rng(0), 1, 10, 4)[0]
    shared.add_batch(batch)
    stored.add_batch(_stored_form(batch))
    frames = lambda b: sum(v.nbytes for k, v in b._data.items() if k in ("obs", "next_obs"))  # noqa: E731
    assert frames(shared) * 2 == frames(stored)


def test_a_lane_that_does_not_continue_drops_its_previous_newest_transition():
    rng = np.random.default_rng(3)
    buf = BatchedReplayBuffer(1000, num_lanes=2, seed=0)
    first, second = _stream(rng, 2, 6, 2, continuing=False)
    for batch in (first, second):
        batch["valid"][:] = True
        batch["terminateds"][:] = batch["truncateds"][:] = False
    second["obs"][0, 0] = first["obs"][-1, 0]  # lane 0 continues, lane 1 does not (a restarted runner)
    buf.add_batch(first)
    buf.add_batch(second)
    assert len(buf) == 2 * 12 - 1
    assert buf._step_id[5, 1] == -1 and buf._step_id[5, 0] == 5
    sample = buf.sample(4000)
    # every sampled next obs is the true one: the successor's obs within a batch, or first["obs"][-1] of lane 0
    truth = {(0, s): o for s, o in enumerate(np.concatenate([first["obs"][1:, 0], second["obs"][1:, 0]]))}
    truth.update({(1, s): o for s, o in enumerate(np.concatenate([first["obs"][1:, 1], second["obs"][1:, 1]]))})
    for index, next_obs in zip(sample["indices"], sample["next_obs"]):
        lane, step = index % 2, buf._flat["step_id"][index]
        np.testing.assert_array_equal(next_obs, truth[(lane, step)])


def test_state_round_trip_keeps_the_pending_rows():
    rng = np.random.default_rng(5)
    buf = BatchedReplayBuffer(64, num_lanes=2, seed=2)
    for batch in _stream(rng, 3, 8, 2):
        buf.add_batch(batch)
    copy = BatchedReplayBuffer(64, num_lanes=2)
    copy.set_state(buf.get_state())
    a, b = buf.sample(128, n_step=2), copy.sample(128, n_step=2)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def test_forms_cannot_be_mixed_and_obs_needs_one_more_row():
    rng = np.random.default_rng(0)
    batch = _stream(rng, 1, 4, 2)[0]
    buf = BatchedReplayBuffer(64, num_lanes=2)
    buf.add_batch(batch)
    with pytest.raises(ValueError, match="filled without a 'next_obs' column"):
        buf.add_batch(_stored_form(batch))
    other = BatchedReplayBuffer(64, num_lanes=2)
    with pytest.raises(ValueError, match=r"column 'obs' has shape \(4, 2, 2, 3\); expected \[T \+ 1, N, \.\.\.\]"):
        other.add_batch({**batch, "obs": batch["obs"][:-1]})
    assert len(other) == 0
