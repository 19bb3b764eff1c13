"""Connectors a user configures are honoured on the columnar path (FastPPO, FastDQN) or refused at validation;
Dict / Tuple observations work (FlattenObservations for RLlib's default module, natively in FastDQN's module)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("ray.rllib")

from ray.rllib.connectors.env_to_module import (  # noqa: E402
    FlattenObservations,
    MeanStdFilter,
    PrevActionsPrevRewards,
    WriteObservationsToEpisodes,
)
from ray.rllib.connectors.env_to_module.frame_stacking import FrameStackingEnvToModule  # noqa: E402
from ray.rllib.connectors.learner.frame_stacking import FrameStackingLearner  # noqa: E402
from ray.rllib.examples.envs.classes.cartpole_with_dict_observation_space import (  # noqa: E402
    CartPoleWithDictObservationSpace,
)
from ray.tune.registry import register_env  # noqa: E402

from rl_speed.algorithms.fast_dqn import FastDQNConfig  # noqa: E402
from rl_speed.algorithms.fast_ppo import FastPPOConfig  # noqa: E402


class LopsidedPendulum(gym.ObservationWrapper):
    """RLlib's mean_std_filtering example env: Pendulum observations moved to [-4000, -1456]."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Box(-4000.0, -1456.0, (3,), np.float32)

    def observation(self, observation):
        return (((observation + 1.0) / 2.0) * (4000.0 - 1456.0) - 4000.0).astype(np.float32)


class TinyImageEnv(gym.Env):
    """10 x 10 x 1 uint8 frames (for frame stacking; RLlib has a default CNN for 10 x 10); reward for action 1 when
    the frame is bright."""

    observation_space = gym.spaces.Box(0, 255, (10, 10, 1), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def _frame(self):
        self.level = int(self.np_random.integers(0, 256))
        return np.full((10, 10, 1), self.level, np.uint8)

    def step(self, action):
        self.t += 1
        reward = float(action == int(self.level > 127))
        return self._frame(), reward, False, self.t >= 20, {}


class FloatFrames(gym.ObservationWrapper):
    """Frames as float32 in [0, 1], as RLlib's Atari wrapper makes them (RLlib's default CNN does not cast uint8)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Box(0.0, 1.0, env.observation_space.shape, np.float32)

    def observation(self, observation):
        return (observation / 255.0).astype(np.float32)


class UInt8DictEnv(gym.Env):
    """A Dict observation with a uint8 image leaf and a Discrete leaf (FastDQN's module reads it natively)."""

    observation_space = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (4, 4, 1), np.uint8),
                                         "flag": gym.spaces.Discrete(2)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        self.flag = int(self.np_random.integers(0, 2))
        return {"image": np.full((4, 4, 1), 200 * self.flag, np.uint8), "flag": self.flag}

    def step(self, action):
        self.t += 1
        return self._obs(), float(action == self.flag), False, self.t >= 10, {}


@pytest.fixture(scope="module", autouse=True)
def envs(ray_session):
    import sys

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # remote env runners cannot import this test file
    register_env("lopsided-pend", lambda _: LopsidedPendulum(gym.make("Pendulum-v1")))
    register_env("dict-cartpole", lambda _: CartPoleWithDictObservationSpace())
    register_env("tiny-image", lambda _: TinyImageEnv())
    register_env("tiny-image-float", lambda _: FloatFrames(TinyImageEnv()))
    register_env("uint8-dict", lambda _: UInt8DictEnv())


def _ppo(env: str, connector, **env_runners):
    return (FastPPOConfig().environment(env)
            .env_runners(num_envs_per_env_runner=4, rollout_fragment_length=32, env_to_module_connector=connector,
                         **{"num_env_runners": 0, **env_runners})
            .training(train_batch_size_per_learner=128 * max(1, env_runners.get("num_env_runners", 0)),
                      minibatch_size=64, num_epochs=1)
            .rl_module(model_config={"fcnet_hiddens": [16]}).debugging(seed=0))


def _filter_pushes(runner_state: dict) -> int:
    connector_state = runner_state["env_to_module_connector"]
    (piece_state,) = [s for s in connector_state.values() if isinstance(s, dict) and None in s]
    return piece_state[None]["running_stats"][0]["num_pushes"]


def test_mean_std_filter_normalizes_training_inputs_and_merges_across_runners(tmp_path):
    algo = _ppo("lopsided-pend", lambda env, spaces, device: MeanStdFilter(), num_env_runners=2).build_algo()
    try:
        algo.train()
        columns = algo.env_runner_group.foreach_env_runner(lambda r: r.sample_columns(), local_env_runner=False)[0]
        obs = columns["obs"]
        assert np.abs(obs.mean()) < 3.0 and obs.min() >= -10.0  # raw observations are around -2,700
        # RLlib merged both runners' statistics into the local runner (which samples nothing itself).
        merged = _filter_pushes(algo.env_runner.get_state())
        assert merged >= 2 * 4 * 32
        path = algo.save_to_path(str(tmp_path / "ckpt"))
    finally:
        algo.stop()
    from ray.rllib.algorithms.algorithm import Algorithm

    restored = Algorithm.from_checkpoint(path)
    try:
        assert _filter_pushes(restored.env_runner.get_state()) == merged  # the filter comes back with the checkpoint
        restored.train()
    finally:
        restored.stop()


def test_mean_std_filter_merges_under_async_sampling_from_the_states_handed_over_with_the_batches():
    # The training step merges the runners' filter states (RLlib's after-iteration sync is off: it would wait for
    # runners busy sampling the next batch); the merged statistics go back to every runner.
    config = _ppo("lopsided-pend", lambda env, spaces, device: MeanStdFilter(), num_env_runners=2)
    algo = config.training(async_sampling=True).build_algo()
    try:
        assert algo.config._dont_auto_sync_env_runner_states
        for _ in range(2):
            algo.train()
        merged = _filter_pushes(algo.env_runner.get_state())
        assert merged >= 2 * 2 * 4 * 32  # both runners' statistics, two batches each
        # Each runner gets the merged statistics. The broadcast is fire-and-forget, as in RLlib, and RLlib drops it
        # for a runner with too many requests in flight, so a runner may get it an iteration or two later.
        for _ in range(5):
            algo.train()
            runner_pushes = algo.env_runner_group.foreach_env_runner(lambda r: _filter_pushes(r.get_state()),
                                                                     local_env_runner=False)
            if all(p >= merged for p in runner_pushes):
                break
        assert all(p >= merged for p in runner_pushes), (runner_pushes, merged)
    finally:
        algo.stop()


def test_mean_std_filter_statistics_reach_the_evaluation_runners():
    config = _ppo("lopsided-pend", lambda env, spaces, device: MeanStdFilter()).evaluation(
        evaluation_interval=1, evaluation_duration=2)
    algo = config.build_algo()
    try:
        result = algo.train()
        trained = _filter_pushes(algo.env_runner.get_state())
        evaluated = _filter_pushes(algo.eval_env_runner.get_state())
        assert trained > 0 and evaluated >= trained  # RLlib synced the training statistics into evaluation
        assert result["evaluation"]["env_runners"]["episode_return_mean"] < 0  # Pendulum returns
    finally:
        algo.stop()


def test_flatten_observations_trains_on_a_dict_space():
    algo = _ppo("dict-cartpole", lambda env, spaces, device: FlattenObservations()).build_algo()
    try:
        result = algo.train()
        columns = algo.env_runner.sample_columns()
        assert columns["obs"].dtype == np.float32 and columns["obs"].ndim == 3  # [T + 1, N, D]: the module's input
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] > 0
    finally:
        algo.stop()


def test_prev_actions_prev_rewards_trains_and_reaches_the_module():
    algo = _ppo("CartPole-v1", lambda env, spaces, device: [PrevActionsPrevRewards(n_prev_actions=2),
                                                             FlattenObservations()]).build_algo()
    try:
        algo.train()
        obs = algo.env_runner.sample_columns()["obs"]
        assert obs.shape[-1] == 4 + 2 * 2 + 1  # observation, two one-hot actions, one reward
    finally:
        algo.stop()


def test_fast_dqn_reads_dict_observations_natively_and_stores_uint8_leaves():
    config = (FastDQNConfig().environment("uint8-dict")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=16)
              .training(train_batch_size_per_learner=32, num_steps_sampled_before_learning_starts=0,
                        replay_buffer_config={"type": "EpisodeReplayBuffer", "capacity": 2000})
              .rl_module(model_config={"fcnet_hiddens": [16]}).debugging(seed=0))
    algo = config.build_algo()
    try:
        for _ in range(3):
            result = algo.train()
        stored = algo.replay_buffer._data["obs"]
        assert stored.dtype.fields["image"][0].base == np.uint8  # uint8 leaves stay uint8 in the buffer
        assert result["learners"]["default_policy"]["qf_loss"] >= 0
    finally:
        algo.stop()


def test_frame_stacking_with_its_learner_piece_trains_fast_dqn():
    config = (FastDQNConfig().environment("tiny-image")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=16,
                           env_to_module_connector=lambda env, spaces, device: FrameStackingEnvToModule(
                               num_frames=3))
              .training(train_batch_size_per_learner=32, num_steps_sampled_before_learning_starts=0,
                        learner_connector=lambda obs, act: FrameStackingLearner(num_frames=3),
                        replay_buffer_config={"type": "EpisodeReplayBuffer", "capacity": 2000})
              .rl_module(model_config={"fcnet_hiddens": [16], "conv_channels": [4]}).debugging(seed=0))
    algo = config.build_algo()
    try:
        algo.train()
        obs = algo.env_runner.sample_columns()["obs"]
        assert obs.shape[2:] == (10, 10, 3) and obs.dtype == np.uint8
    finally:
        algo.stop()


def test_rllib_frame_stacking_example_configuration_runs_with_fast_ppo():
    """ray/rllib/examples/connectors/frame_stacking.py's configuration (env-to-module and learner frame stacking,
    its training and model settings) with FastPPOConfig, on a small image env instead of Pong."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    config = (FastPPOConfig().environment("tiny-image-float")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=2, rollout_fragment_length=64,
                           env_to_module_connector=lambda env, spaces, device: FrameStackingEnvToModule(
                               num_frames=4))
              .training(learner_connector=lambda obs, act: FrameStackingLearner(num_frames=4), entropy_coeff=0.01,
                        lr=0.00015, grad_clip=100.0, grad_clip_by="global_norm", train_batch_size_per_learner=128,
                        minibatch_size=64, num_epochs=2)
              .rl_module(model_config=DefaultModelConfig(vf_share_layers=True)).debugging(seed=0))
    algo = config.build_algo()
    try:
        result = algo.train()
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] >= 100  # 128 minus the reset steps
        assert algo.env_runner.sample_columns()["obs"].shape[2:] == (10, 10, 4)
    finally:
        algo.stop()


@pytest.mark.parametrize("change, needle", [
    (dict(env_to_module_connector=lambda env, spaces, device: WriteObservationsToEpisodes()),
     "WriteObservationsToEpisodes failed on the env's first observation"),
    (dict(module_to_env_connector=lambda env, spaces: WriteObservationsToEpisodes()), "module_to_env_connector"),
    (dict(add_default_connectors_to_env_to_module_pipeline=False), "add_default_connectors_to_env_to_module"),
])
def test_connectors_without_a_columnar_form_are_refused_at_validation(change, needle):
    for config in (FastPPOConfig(), FastDQNConfig()):
        config.environment("CartPole-v1").env_runners(**change)
        with pytest.raises(ValueError, match=needle):
            config.validate()


def test_prev_actions_on_continuous_actions_and_multi_agent_pieces_are_refused_at_validation():
    config = FastPPOConfig().environment("Pendulum-v1").env_runners(
        env_to_module_connector=lambda env, spaces, device: [PrevActionsPrevRewards(), FlattenObservations()])
    with pytest.raises(ValueError, match="env_to_module_connector` could not be built.*Box"):  # RLlib's piece fails
        config.validate()
    config = FastPPOConfig().environment("CartPole-v1").env_runners(
        env_to_module_connector=lambda env, spaces, device: MeanStdFilter(multi_agent=True))
    with pytest.raises(ValueError, match="multi_agent=True"):
        config.validate()


def test_learner_connector_pieces_are_refused_at_validation():
    config = FastPPOConfig().environment("CartPole-v1").training(
        learner_connector=lambda obs, act: WriteObservationsToEpisodes())
    with pytest.raises(ValueError, match="learner_connector.*WriteObservationsToEpisodes"):
        config.validate()


def _train_until(config, reward: float, timesteps: int) -> tuple[float, int]:
    """Trains until the mean return reaches ``reward`` or ``timesteps`` env steps (the examples' stop criteria)."""
    import time

    algo = config.build_algo()
    try:
        best, steps, start = float("-inf"), 0, time.perf_counter()
        while steps < timesteps and best < reward:
            runners = algo.train()["env_runners"]
            steps = runners["num_env_steps_sampled_lifetime"]
            best = max(best, runners.get("episode_return_mean", float("-inf")))
        print(f"\n{config.env}: mean return {best:.1f} after {steps:,} env steps, {time.perf_counter() - start:.0f} s")
        return best, steps
    finally:
        algo.stop()


@pytest.mark.slow
@pytest.mark.ci  # about 15 s: the CI selection's check that a connector example still learns
def test_rllib_flatten_observations_dict_space_example_reaches_its_stop_reward():
    """ray/rllib/examples/connectors/flatten_observations_dict_space.py with FastPPOConfig: 400 within 200k."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    config = (FastPPOConfig().environment("dict-cartpole")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=8,
                           env_to_module_connector=lambda env, spaces, device: FlattenObservations())
              .training(gamma=0.99, lr=0.0003, num_epochs=6, vf_loss_coeff=0.01)
              .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[32], fcnet_activation="linear",
                                                         vf_share_layers=True)))
    best, steps = _train_until(config, 400.0, 200_000)
    assert best >= 400.0, f"mean return {best:.1f} after {steps} env steps"


@pytest.mark.slow
def test_rllib_mean_std_filtering_example_reaches_its_stop_reward():
    """ray/rllib/examples/connectors/mean_std_filtering.py with FastPPOConfig: -300 within 500k (lopsided
    Pendulum: without the filter the observations are around -2,700)."""
    import torch
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    config = (FastPPOConfig().environment("lopsided-pend")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=20,
                           env_to_module_connector=lambda env, spaces, device: MeanStdFilter())
              .training(train_batch_size_per_learner=512, gamma=0.95, lr=0.0003, vf_loss_coeff=0.01,
                        minibatch_size=64, lambda_=0.1, vf_clip_param=10.0)
              .rl_module(model_config=DefaultModelConfig(
                  fcnet_activation="relu", fcnet_kernel_initializer=torch.nn.init.xavier_uniform_,
                  fcnet_bias_initializer=torch.nn.init.constant_, fcnet_bias_initializer_kwargs={"val": 0.0})))
    best, steps = _train_until(config, -300.0, 500_000)
    assert best >= -300.0, f"mean return {best:.1f} after {steps} env steps"


@pytest.mark.slow
def test_rllib_prev_actions_prev_rewards_example_reaches_its_stop_reward():
    """ray/rllib/examples/connectors/prev_actions_prev_rewards.py with FastPPOConfig: stateless CartPole, RLlib's
    LSTM (use_lstm) fed the previous action and reward; 200 within 1M."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.examples.envs.classes.stateless_cartpole import StatelessCartPole
    from torch import nn

    register_env("stateless-cartpole", lambda _: StatelessCartPole())
    config = (FastPPOConfig().environment("stateless-cartpole")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=8,
                           env_to_module_connector=lambda env, spaces, device: [PrevActionsPrevRewards(),
                                                                                 FlattenObservations()])
              .training(num_epochs=6, lr=0.0003, train_batch_size=4000, vf_loss_coeff=0.01)
              .rl_module(model_config=DefaultModelConfig(
                  use_lstm=True, max_seq_len=20, fcnet_hiddens=[32], fcnet_activation="linear",
                  fcnet_kernel_initializer=nn.init.xavier_uniform_, fcnet_bias_initializer=nn.init.constant_,
                  fcnet_bias_initializer_kwargs={"val": 0.0}, vf_share_layers=True)))
    best, steps = _train_until(config, 200.0, 1_000_000)
    assert best >= 200.0, f"mean return {best:.1f} after {steps} env steps"
