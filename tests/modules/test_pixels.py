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


def test_normalize_obs_keeps_running_pixel_statistics_in_the_modules_state():
    space = gym.spaces.Box(0, 255, (40, 40, 2), np.uint8)
    plain = NatureActorCritic(observation_space=space, action_space=gym.spaces.Discrete(3), model_config={})
    assert not any("obs_norm" in key for key in plain.state_dict())  # checkpoints without it keep loading
    assert not plain.keeps_input_statistics  # the learner selects no frames for it
    net = NatureActorCritic(observation_space=space, action_space=gym.spaces.Discrete(3),
                            model_config={"normalize_obs": True})
    net.obs_norm.chunk = 3  # several chunks: the same statistics as one
    frames = torch.randint(0, 256, (8, 40, 40, 2), dtype=torch.uint8)
    before = net._forward({Columns.OBS: frames})[Columns.EMBEDDINGS]
    net.update_input_statistics(frames)
    pixels = frames.double().permute(0, 3, 1, 2) / 255  # the module's [C, H, W] after its 1/255
    torch.testing.assert_close(net.state_dict()["obs_norm.mean"], pixels.mean(0) * 8 / 9)
    assert net.state_dict()["obs_norm.count"].item() == 9
    assert not torch.allclose(net._forward({Columns.OBS: frames})[Columns.EMBEDDINGS], before)


def test_normalize_value_keeps_value_statistics_in_the_modules_state():
    space = gym.spaces.Box(0, 255, (40, 40, 2), np.uint8)
    plain = NatureActorCritic(observation_space=space, action_space=gym.spaces.Discrete(3), model_config={})
    assert not plain.keeps_value_statistics and not any("value_norm" in key for key in plain.state_dict())
    net = NatureActorCritic(observation_space=space, action_space=gym.spaces.Discrete(3),
                            model_config={"normalize_value": True})
    assert net.keeps_value_statistics
    assert {"value_norm.mean", "value_norm.var", "value_norm.count"} <= set(net.state_dict())
    assert net.state_dict()["value_norm.mean"].shape == ()  # one number: the value targets' mean
