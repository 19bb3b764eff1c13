"""Cue corridor: scalar and vector forms agree in lockstep, the cue shows only at the first step, rewards follow
the cue, and bad input is named."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from rl_speed_envs.memory import CueCorridorEnv, CueCorridorVectorEnv


def test_vector_matches_scalar_in_lockstep():
    n, length = 5, 3
    vec = CueCorridorVectorEnv(num_envs=n, length=length)
    scalars = [CueCorridorEnv(length=length) for _ in range(n)]
    obs, _ = vec.reset(seed=7)
    np.testing.assert_array_equal(obs, np.stack([s.reset(seed=7 + i)[0] for i, s in enumerate(scalars)]))
    rng = np.random.default_rng(0)
    resetting = np.zeros(n, bool)
    for _ in range(60):
        actions = rng.integers(0, 2, n)
        obs, rewards, terms, truncs, _ = vec.step(actions)
        for i, s in enumerate(scalars):
            if resetting[i]:
                o, r, d = s.reset()[0], 0.0, False
            else:
                o, r, d, _, _ = s.step(int(actions[i]))
            np.testing.assert_array_equal(obs[i], o)
            assert rewards[i] == r and terms[i] == d and not truncs[i]
            resetting[i] = d


def test_cue_only_at_first_step_and_reward_follows_it():
    env = CueCorridorEnv(length=4)
    check_env(env, skip_render_check=True)
    for seed in range(6):
        obs, _ = env.reset(seed=seed)
        cue = int(np.argmax(obs[:2]))
        assert obs[:2].sum() == 1
        for _ in range(4):
            obs, reward, done, _, _ = env.step(0)
            assert obs[:2].sum() == 0 and reward == 0 and not done
        assert obs[3] == 1
        _, reward, done, _, _ = env.step(cue)
        assert reward == 1.0 and done


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="`length`=0 is invalid"):
        CueCorridorEnv(length=0)
    env = CueCorridorVectorEnv(num_envs=2)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"needs 2 actions in \{0, 1\}"):
        env.step(np.array([0, 2]))
