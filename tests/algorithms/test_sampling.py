"""ColumnSampler under async sampling: FastPPO's train batch takes batches as they arrive, from any runner."""

from __future__ import annotations

import sys
import time

import gymnasium as gym
import ray
from ray import tune

from rl_speed.algorithms.fast_ppo import FastPPOConfig

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # remote runners build this test env


class _SlowOnFirstRunner(gym.Wrapper):
    """CartPole whose steps take 50 ms on env runner 1 and no extra time elsewhere."""

    def __init__(self, config):
        super().__init__(gym.make("CartPole-v1"))
        self.delay = 0.05 if getattr(config, "worker_index", 0) == 1 else 0.0

    def step(self, action):
        time.sleep(self.delay)
        return self.env.step(action)


def test_async_ppo_batches_come_from_whichever_runner_is_ready(ray_session):
    """One train batch is num_env_runners batches from any runners: the fast runner keeps sampling while the slow one
    (0.4 s per batch) works on its first, instead of every iteration waiting for one batch from each."""
    tune.register_env("slow_on_first_runner", _SlowOnFirstRunner)
    config = (FastPPOConfig().environment("slow_on_first_runner")
              .env_runners(num_env_runners=2, num_envs_per_env_runner=2, rollout_fragment_length=8,
                           gym_env_vectorize_mode="sync")
              .rl_module(model_config={"fcnet_hiddens": [16], "head_fcnet_hiddens": []})
              .training(train_batch_size_per_learner=32, minibatch_size=32, num_epochs=1)
              .reporting(min_time_s_per_iteration=0)
              .debugging(seed=1))
    config.async_sampling = True
    algo = config.build_algo()
    try:
        calls = [algo._sampler.sample() for _ in range(3)]
        assert [len(batches) for batches in calls] == [2, 2, 2]  # the train batch keeps its size
        runners = [batch.worker_index for batches in calls for batch in batches]
        assert runners.count(2) >= 4, runners  # waiting for every runner would give 3 from each
        result = algo.train()  # batches kept from earlier calls train like any other
        assert result["sampler"]["batches_received_lifetime"] >= 2
    finally:
        algo.stop()
