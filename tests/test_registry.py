"""rl_speed.register(): idempotent, and RLlib builds our envs through it, locally and on remote env runners."""

from __future__ import annotations

import numpy as np

import rl_speed
from rl_speed import registry
from rl_speed_envs import SnakeEnv, SnakeVectorEnv


def test_register_is_idempotent_and_creator_picks_the_form():
    rl_speed.register()
    rl_speed.register()
    from ray.tune.registry import ENV_CREATOR, _global_registry

    assert _global_registry.contains(ENV_CREATOR, "rl_speed/Snake-v0")
    creator = registry.make_env_creator("rl_speed/Snake-v0")
    assert isinstance(creator({"height": 6}), SnakeEnv)
    vec = creator({"height": 6, "num_envs": 16})
    assert isinstance(vec, SnakeVectorEnv) and vec.num_envs == 16 and vec.cfg.height == 6


def test_names_resolve_to_classes():
    from ray.rllib.algorithms.ppo import PPO

    assert registry.resolve_algorithm("PPO") is PPO
    assert registry.env_is_known("rl_speed/Snake-v0") and registry.env_is_known("CartPole-v1")
    assert not registry.env_is_known("NoSuchEnv-v9")


def test_stock_ppo_samples_our_vector_env_on_a_remote_env_runner(ray_session):
    from ray.rllib.algorithms.ppo import PPOConfig

    config = (
        PPOConfig()
        .environment("rl_speed/Snake-v0", env_config={"height": 6, "width": 6, "observation": "flat"})
        .env_runners(num_env_runners=1, num_envs_per_env_runner=16, gym_env_vectorize_mode="vector_entry_point",
                     rollout_fragment_length=32)
        .training(train_batch_size_per_learner=512, minibatch_size=256, num_epochs=1)
    )
    algo = config.build_algo()
    try:
        result = algo.train()
        runner_envs = algo.env_runner_group.foreach_env_runner(
            lambda r: type(r.env.unwrapped).__name__, local_env_runner=False)
    finally:
        algo.stop()
    assert runner_envs == ["SnakeVectorEnv"]
    assert result["env_runners"]["num_env_steps_sampled_lifetime"] >= 512
    assert np.isfinite(result["env_runners"]["episode_return_mean"])
