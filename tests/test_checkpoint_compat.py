"""Checkpoints written by an earlier rl_speed (tests/fixtures/checkpoints, made at commit a6b05f4, before the
columnar path moved into its own modules) still restore: the classes they name by import path still import, the
weights come back unchanged and training continues."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "checkpoints"


@pytest.mark.parametrize("name", ["fast_ppo", "fast_dqn"])
def test_old_checkpoint_restores_and_trains(ray_session, name):
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.rllib.core import DEFAULT_MODULE_ID

    path = FIXTURES / name
    saved = pickle.loads((path / "learner_group" / "learner" / "rl_module" / DEFAULT_MODULE_ID
                          / "module_state.pkl").read_bytes())
    algo = Algorithm.from_checkpoint(str(path))
    try:
        restored = algo.learner_group.get_weights()[DEFAULT_MODULE_ID]
        assert set(restored) == set(saved)
        for key, value in saved.items():
            np.testing.assert_array_equal(np.asarray(restored[key]), np.asarray(value), err_msg=key)
        assert algo.iteration == 2
        if name == "fast_dqn":
            assert len(algo.replay_buffer) > 0  # the buffer was saved with the checkpoint
        result = algo.train()
        assert algo.iteration == 3
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] > 0
    finally:
        algo.stop()
