"""vectorized_gae equals RLlib's compute_value_targets on random columns with terminations, truncations, NEXT_STEP
reset steps and rollout cuts; plus a hand-computed case."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ray.rllib.utils.postprocessing.value_predictions import compute_value_targets

from rl_speed.gae import standardize, vectorized_gae


def _random_columns(rng, t_len, n):
    """Columns as the BatchedEnvRunner writes them: after each episode end comes one invalid reset step."""
    terminated = np.zeros((t_len, n), bool)
    truncated = np.zeros((t_len, n), bool)
    valid = np.ones((t_len, n), bool)
    for lane in range(n):
        t = 0
        while t < t_len:
            if rng.random() < 0.08:
                (terminated if rng.random() < 0.5 else truncated)[t, lane] = True
                if t + 1 < t_len:
                    valid[t + 1, lane] = False
                t += 2
            else:
                t += 1
    rewards = rng.normal(size=(t_len, n)).astype(np.float32)
    values = rng.normal(size=(t_len + 1, n)).astype(np.float32)
    return values, rewards, terminated, truncated, valid


def _rllib_reference(values, rewards, terminated, truncated, valid, gamma, lambda_):
    """Per lane, per episode chunk, laid out as RLlib's AddOneTsToEpisodesAndTruncate does: one extra step carrying
    V(next obs); the last real step is terminated, or else truncated (env truncation or rollout cut)."""
    t_len, n = rewards.shape
    out = np.zeros((t_len, n), np.float32)
    for lane in range(n):
        t = 0
        while t < t_len:
            if not valid[t, lane]:
                t += 1
                continue
            end = t
            while end < t_len - 1 and not (terminated[end, lane] or truncated[end, lane]):
                end += 1
            steps = slice(t, end + 1)
            vals = np.append(values[steps, lane], values[end + 1, lane])  # + the artificial step's value
            rew = np.append(rewards[steps, lane], 0.0)
            term = np.append(terminated[steps, lane], False).astype(np.float32)
            trunc = np.zeros(end + 2 - t, np.float32)
            trunc[-2] = 0.0 if terminated[end, lane] else 1.0
            targets = compute_value_targets(vals, rew, term, trunc, gamma=gamma, lambda_=lambda_)
            out[steps, lane] = targets[:-1] - vals[:-1]
            t = end + 1
    return out


@pytest.mark.parametrize("seed, t_len, n", [(0, 64, 16), (1, 200, 3), (2, 7, 50)])
def test_matches_rllib_compute_value_targets(seed, t_len, n):
    rng = np.random.default_rng(seed)
    values, rewards, terminated, truncated, valid = _random_columns(rng, t_len, n)
    assert terminated.any() and truncated.any()
    want = _rllib_reference(values, rewards, terminated, truncated, valid, 0.99, 0.95)
    adv, targets = vectorized_gae(*(torch.as_tensor(x) for x in (values, rewards, terminated, truncated, valid)),
                                  gamma=0.99, lambda_=0.95)
    np.testing.assert_allclose(adv.numpy() * valid, want, atol=1e-5)
    np.testing.assert_allclose(targets.numpy() * valid, (want + values[:-1]) * valid, atol=1e-5)


def test_hand_computed_case():
    # One lane: r = 1, 1, 1; V = 0.5 everywhere; step 1 terminates; step 2 is the reset step (invalid).
    values = torch.full((4, 1), 0.5)
    rewards = torch.ones(3, 1)
    terminated = torch.tensor([[False], [True], [False]])
    truncated = torch.zeros(3, 1, dtype=torch.bool)
    valid = torch.tensor([[True], [True], [False]])
    adv, _ = vectorized_gae(values, rewards, terminated, truncated, valid, gamma=0.5, lambda_=1.0)
    # delta_1 = 1 - 0.5 = 0.5 (no bootstrap); delta_0 = 1 + 0.5 * 0.5 - 0.5 = 0.75; A_0 = 0.75 + 0.5 * 0.5 = 1.0
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.0, 0.5, 0.0]))


def test_truncation_bootstraps_and_termination_does_not():
    values = torch.tensor([[0.0], [10.0]])
    rewards = torch.zeros(1, 1)
    for terminated, truncated, expected in ((False, True, 9.9), (True, False, 0.0)):
        adv, _ = vectorized_gae(values, rewards, torch.tensor([[terminated]]), torch.tensor([[truncated]]),
                                gamma=0.99, lambda_=0.9)
        assert adv.item() == pytest.approx(expected)


def test_standardize_ignores_invalid_entries():
    adv = torch.tensor([[1.0, 100.0], [3.0, -50.0]])
    valid = torch.tensor([[True, False], [True, False]])
    out = standardize(adv, valid)
    torch.testing.assert_close(out[:, 0], torch.tensor([-1.0, 1.0]), atol=1e-6, rtol=0)
    assert (out[:, 1] == 0).all()


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match=r"\[T \+ 1, N\]"):
        vectorized_gae(torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(3, 2),
                       gamma=0.9, lambda_=0.9)
