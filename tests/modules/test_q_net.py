"""QNetModule's model_config at build time: what only the observations decide (the config-time checks of its keys
are in tests/algorithms/test_config.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rl_speed.modules.q_net import QNetModule


def test_conv_channels_on_observations_that_go_to_an_mlp_are_refused():
    # `encoder` left to the observations: vectors get an MLP, which `conv_channels` would not size
    with pytest.raises(ValueError, match="`conv_channels` sizes a CNN, but observations of shape"):
        QNetModule(observation_space=gym.spaces.Box(-1, 1, (4,), np.float32), action_space=gym.spaces.Discrete(2),
                   model_config={"conv_channels": [16, 32]})
    module = QNetModule(observation_space=gym.spaces.Box(0, 3, (6, 6), np.int64), action_space=gym.spaces.Discrete(2),
                        model_config={"conv_channels": [8]})  # small-integer grids: one-hot planes, a CNN
    assert module.q.encoder[0].out_channels == 8


def test_normalize_obs_statistics_reach_the_target_network_with_its_update():
    import torch

    from ray.rllib.core.learner.utils import update_target_network

    module = QNetModule(observation_space=gym.spaces.Box(-10, 10, (3,), np.float32),
                        action_space=gym.spaces.Discrete(2), model_config={"normalize_obs": True})
    module.make_target_networks()
    module.q.obs_norm.chunk = 4  # several chunks: the same statistics as one
    obs = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 5.0]] * 5)
    module.update_input_statistics(obs)
    torch.testing.assert_close(module.q.obs_norm.mean, obs.double().mean(0) * 10 / 11)
    assert module._target_q.obs_norm.count.item() == 1  # the target keeps its statistics until it is updated
    (online, target), = module.get_target_network_pairs()
    update_target_network(main_net=online, target_net=target, tau=1.0)  # what RLlib's DQN learner does
    torch.testing.assert_close(module._target_q.obs_norm.var, module.q.obs_norm.var)
    assert module._target_q.obs_norm.count.item() == 11
    plain = QNetModule(observation_space=gym.spaces.Box(-10, 10, (3,), np.float32),
                       action_space=gym.spaces.Discrete(2), model_config={})
    assert plain.q.obs_norm is None and not any("obs_norm" in key for key in plain.state_dict())


@pytest.mark.parametrize("space, expected", [
    # uint8 frames: /255 in float32, channels first, exactly as a cast and then a multiply would give
    (gym.spaces.Box(0, 255, (5, 6, 4), np.uint8),
     lambda obs: (obs.float() * (1.0 / 255.0)).permute(0, 3, 1, 2)),
    # float vectors: cast only; small-integer grids: one-hot planes
    (gym.spaces.Box(-1, 1, (7,), np.float32), lambda obs: obs.float()),
    (gym.spaces.Box(0, 3, (4, 5), np.int64),
     lambda obs: torch.nn.functional.one_hot(obs.long(), 4).float().permute(0, 3, 1, 2)),
])
def test_obs_preprocessor_gives_float32_in_the_encoders_layout(space, expected):
    from rl_speed.modules.q_net import ObsPreprocessor

    obs = torch.from_numpy(np.stack([space.sample() for _ in range(3)]))
    out = ObsPreprocessor(space)(obs)
    assert out.dtype == torch.float32
    assert torch.equal(out, expected(obs))
