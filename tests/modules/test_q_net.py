"""QNetModule's model_config at build time: what only the observations decide (the config-time checks of its keys
are in tests/algorithms/test_config.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rl_speed.modules.q_net import QNetModule


def test_conv_channels_on_observations_that_go_to_an_mlp_are_refused():
    # `encoder` left to the observations: vectors get an MLP, which `conv_channels` would not size
    with pytest.raises(ValueError, match="`conv_channels` sizes a CNN, but observations of shape"):
        QNetModule(observation_space=gym.spaces.Box(-1, 1, (4,), np.float32), action_space=gym.spaces.Discrete(2),
                   model_config={"conv_channels": [16, 32]})
    module = QNetModule(observation_space=gym.spaces.Box(0, 3, (6, 6), np.int64), action_space=gym.spaces.Discrete(2),
                        model_config={"conv_channels": [8]})  # small-integer grids: one-hot planes, a CNN
    assert module.q.encoder[0].out_channels == 8
