"""VectorizedGAE gives the same advantages and value targets as RLlib's GeneralAdvantageEstimation on real PPO
episodes, and RLlib's flat compute_value_targets is reproduced exactly."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.connectors.learner.general_advantage_estimation import GeneralAdvantageEstimation
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.utils.postprocessing.value_predictions import compute_value_targets

from rl_speed.gae import flat_value_targets
from rl_speed.connectors.vectorized_gae import VectorizedGAE
from rl_speed.learners.ppo import VectorizedGAEPPOTorchLearner


@pytest.mark.parametrize("n", [1, 7, 500, 5000])
def test_flat_value_targets_equal_rllibs_loop(n):
    rng = np.random.default_rng(n)
    arrays = [rng.normal(size=n).astype(np.float32), rng.normal(size=n).astype(np.float32),
              (rng.random(n) < 0.05).astype(np.float32), (rng.random(n) < 0.05).astype(np.float32)]
    want = compute_value_targets(*arrays, gamma=0.99, lambda_=0.95)
    got = flat_value_targets(*(torch.as_tensor(a) for a in arrays), gamma=0.99, lambda_=0.95)
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5)


def test_learner_pipeline_matches_stock_ppo_on_real_episodes():
    config = (PPOConfig().environment("CartPole-v1")
              .env_runners(num_envs_per_env_runner=4, rollout_fragment_length=100).debugging(seed=0))
    env_runner = SingleAgentEnvRunner(config=config)
    episodes = env_runner.sample(num_timesteps=400, random_actions=True)
    assert any(e.is_terminated for e in episodes) and any(not e.is_done for e in episodes)
    stock = config.build_learner(env=gym.make("CartPole-v1"))  # build_learner() also builds it
    ours = config.copy(copy_frozen=False).learners(learner_class=VectorizedGAEPPOTorchLearner) \
        .build_learner(env=gym.make("CartPole-v1"))
    ours.module.set_state(stock.module.get_state())
    pieces = [type(p) for p in ours._learner_connector.connectors]
    assert pieces.count(VectorizedGAE) == 1 and GeneralAdvantageEstimation not in pieces

    def run(learner):
        copies = copy.deepcopy(episodes)  # the pipeline elongates episodes in place
        out = learner._learner_connector(rl_module=learner.module, batch={}, episodes=copies, shared_data={},
                                         metrics=None)[DEFAULT_MODULE_ID]
        return {k: np.asarray(torch.as_tensor(out[k]).cpu()) for k in ("advantages", "value_targets")}

    want, got = run(stock), run(ours)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], atol=1e-4, err_msg=key)
