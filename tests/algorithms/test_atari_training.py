"""FastPPO and FastDQN on rl_speed/Atari-v0 (the [atari] extra): uint8 frames from ale-py's vector env through the
columns, the replay buffer and the learner's batch up to the module; RLlib's frame_stacking.py example configuration
on real Pong. No learning check runs on CPU: the Nature CNN's learner trains about 200 env steps/s on 2 cores, and
Pong or Breakout need millions (docs/studies/pong-and-atari.md has the GPU runs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("ale_py", reason="the [atari] extra is not installed")

import rl_speed  # noqa: E402

rl_speed.register()

from ray.rllib.core.rl_module.rl_module import RLModuleSpec  # noqa: E402

from rl_speed.algorithms.fast_dqn import FastDQNConfig  # noqa: E402
from rl_speed.algorithms.fast_ppo import FastPPOConfig  # noqa: E402
from rl_speed.modules.pixels import NatureActorCritic  # noqa: E402


def test_fast_ppo_trains_the_nature_module_on_uint8_frames(ray_session):
    config = (FastPPOConfig().environment("rl_speed/Atari-v0", env_config={"game": "pong"})
              .env_runners(num_env_runners=0, num_envs_per_env_runner=2, rollout_fragment_length=16)
              .training(train_batch_size_per_learner=32, minibatch_size=16, num_epochs=1)
              .rl_module(rl_module_spec=RLModuleSpec(module_class=NatureActorCritic)))
    algo = config.build_algo()
    try:
        result = algo.train()
        assert "policy_loss" in result["learners"]["default_policy"]
        columns = algo.env_runner.sample_columns()
        assert columns["obs"].dtype == np.uint8 and columns["obs"].shape == (17, 2, 84, 84, 4)
        learner = algo.learner_group._learner
        rows, = learner.prepare_columns([columns], minibatch_size=16)
        assert rows.batch["obs"].dtype == torch.uint8  # cast to float inside the module only
    finally:
        algo.stop()


def test_fast_ppo_on_breakout_with_an_episode_per_life_and_clipping_in_the_runner(ray_session):
    """The Breakout presets' env settings plus ``life_episodes``: a lost life ends an episode in the columns (the
    value target stops there) while the game plays on; the runner clips the rewards it trains on."""
    config = (FastPPOConfig().environment("rl_speed/Atari-v0", env_config={"game": "breakout", "life_episodes": True,
                                                                           "reward_clipping": False},
                                          clip_rewards=True)
              .env_runners(num_env_runners=0, num_envs_per_env_runner=2, rollout_fragment_length=256)
              .training(train_batch_size_per_learner=512, minibatch_size=256, num_epochs=1)
              .rl_module(rl_module_spec=RLModuleSpec(module_class=NatureActorCritic))
              .evaluation(evaluation_interval=1, evaluation_num_env_runners=0, evaluation_duration=64,
                          evaluation_duration_unit="timesteps")
              .debugging(seed=0))
    algo = config.build_algo()
    try:
        result = algo.train()
        # whole games' scores reach the result beside the lives' returns (the GPU preset's Breakout stop reads it),
        # from evaluation (RLlib's sample()) too
        assert "game_return_mean" in result["env_runners"]
        assert "game_return_mean" in result["evaluation"]["env_runners"]
        columns = algo.env_runner.sample_columns()
        # Random play in 2 x 256 steps (seeds 0-11 of the env alone) ends 10-16 lives but only 1-2 whole games; 128
        # steps a lane left too little margin (5 lives once in CI), so the lanes run 256 steps and the runner is seeded.
        assert columns["terminateds"].sum() >= 6
        assert set(np.unique(columns["rewards"])) <= {0.0, 1.0}
    finally:
        algo.stop()


def test_fast_dqn_stores_uint8_frames_and_trains_the_nature_q_net(ray_session):
    config = (FastDQNConfig().environment("rl_speed/Atari-v0", env_config={"game": "breakout"})
              .env_runners(num_env_runners=0, num_envs_per_env_runner=2, rollout_fragment_length=16)
              .training(train_batch_size_per_learner=16, num_steps_sampled_before_learning_starts=32,
                        replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": 512})
              .rl_module(model_config={"encoder": "nature", "batch_norm": False})
              .reporting(min_sample_timesteps_per_iteration=64))
    algo = config.build_algo()
    try:
        result = algo.train()
        assert "qf_loss" in result["learners"]["default_policy"]
        buffer = algo.replay_buffer
        assert buffer._data["obs"].dtype == np.uint8 and buffer._data["obs"].shape[2:] == (84, 84, 4)
    finally:
        algo.stop()


def test_rllib_frame_stacking_example_configuration_on_pong_runs_with_fast_ppo(ray_session):
    """ray/rllib/examples/connectors/frame_stacking.py's configuration on ALE/Pong-v5 (RLlib's Atari wrappers
    without frame stacking, then FrameStacking connectors on the runner and the learner), with FastPPOConfig and a
    smaller batch."""
    import gymnasium as gym

    from ray.rllib.connectors.env_to_module.frame_stacking import FrameStackingEnvToModule
    from ray.rllib.connectors.learner.frame_stacking import FrameStackingLearner
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack
    from ray.tune.registry import register_env

    register_env("atari-env", lambda cfg: wrap_atari_for_new_api_stack(
        gym.make("ale_py:ALE/Pong-v5", **cfg, render_mode="rgb_array"), framestack=None))
    config = (FastPPOConfig()
              .environment("atari-env", env_config={"frameskip": 1, "full_action_space": False,
                                                    "repeat_action_probability": 0.0}, clip_rewards=True)
              .env_runners(num_env_runners=0, num_envs_per_env_runner=2, rollout_fragment_length=32,
                           env_to_module_connector=lambda env, spaces, device: FrameStackingEnvToModule(
                               num_frames=4))
              .training(learner_connector=lambda obs, act: FrameStackingLearner(num_frames=4), entropy_coeff=0.01,
                        lr=0.00015, grad_clip=100.0, grad_clip_by="global_norm", num_epochs=10, minibatch_size=64,
                        lambda_=0.95, kl_coeff=0.5, clip_param=0.1, vf_clip_param=10.0,
                        train_batch_size_per_learner=64)
              .rl_module(model_config=DefaultModelConfig(
                  vf_share_layers=True, conv_filters=[(16, 4, 2), (32, 4, 2), (64, 4, 2), (128, 4, 2)],
                  conv_activation="relu", head_fcnet_hiddens=[256])))
    algo = config.build_algo()
    try:
        result = algo.train()
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] >= 60
        assert algo.env_runner.sample_columns()["obs"].shape[2:] == (64, 64, 4)  # RLlib's 64 x 64 frames, stacked
    finally:
        algo.stop()
