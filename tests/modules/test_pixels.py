"""NatureActorCritic: uint8 frames in, logits and values out; other spaces refused with the reason."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from ray.rllib.core.columns import Columns

from rl_speed.modules.pixels import NatureActorCritic


def test_uint8_frames_to_logits_and_values():
    net = NatureActorCritic(observation_space=gym.spaces.Box(0, 255, (84, 84, 4), np.uint8),
                            action_space=gym.spaces.Discrete(6), model_config={})
    frames = torch.randint(0, 256, (3, 84, 84, 4), dtype=torch.uint8)
    out = net._forward({Columns.OBS: frames})
    assert out[Columns.ACTION_DIST_INPUTS].shape == (3, 6)
    assert out[Columns.ACTION_DIST_INPUTS].abs().max() < 1.0  # near-uniform first policy
    values = net.compute_values({Columns.OBS: frames})
    assert values.shape == (3,)
    torch.testing.assert_close(values, net.compute_values({}, embeddings=out[Columns.EMBEDDINGS]))


def test_refuses_float_vectors():
    with pytest.raises(ValueError, match="uint8 frames"):
        NatureActorCritic(observation_space=gym.spaces.Box(-1, 1, (4,), np.float32),
                          action_space=gym.spaces.Discrete(2))
