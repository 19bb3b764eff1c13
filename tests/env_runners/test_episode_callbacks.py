"""RLlib's callbacks on the columnar runners: the same callbacks report the same custom metrics on stock PPO and
FastPPO, every hook is called in RLlib's order with RLlib's arguments (class and shorthand, local and remote runners,
evaluation, FastDQN, multi-agent), the terminal step reaches ``on_episode_end``, and rl_speed's ``on_sample_columns``
sees the batch and its ended episodes."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
import ray.cloudpickle

from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.env.multi_agent_env import MultiAgentEnv

from rl_speed.callbacks import ColumnarCallback
from rl_speed.env_runners.episode_callbacks import LaneEpisode, StepHistory, lane_info

# Remote runners rebuild this module's envs and callbacks from pickles: ship them by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

LENGTH = 5


class CountEnv(gym.Env):
    """Every episode is exactly LENGTH steps: obs ``[k, last action]``, reward 1 per step, info ``{"k": k}`` (and
    ``"final": k`` on the last step, which terminates)."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config=None):
        self.k = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.k = 0
        return np.zeros(2, np.float32), {"k": 0}

    def step(self, action):
        self.k += 1
        done = self.k == LENGTH
        info = {"k": self.k} | ({"final": self.k} if done else {})
        return np.array([self.k, action], np.float32), 1.0, done, False, info


class TwoAgentCountEnv(MultiAgentEnv):
    """Two agents stepping CountEnv together; agent ``b`` gets reward 2 per step."""

    def __init__(self, config=None):
        super().__init__()
        self.possible_agents = self.agents = ["a", "b"]
        self.observation_spaces = {aid: CountEnv.observation_space for aid in self.agents}
        self.action_spaces = {aid: CountEnv.action_space for aid in self.agents}
        self.k = 0

    def reset(self, *, seed=None, options=None):
        self.k = 0
        return {aid: np.zeros(2, np.float32) for aid in self.agents}, {aid: {"k": 0} for aid in self.agents}

    def step(self, actions):
        self.k += 1
        done = self.k == LENGTH
        obs = {aid: np.array([self.k, actions[aid]], np.float32) for aid in self.agents}
        return (obs, {"a": 1.0, "b": 2.0}, {"a": done, "b": done, "__all__": done},
                {"a": False, "b": False, "__all__": False}, {aid: {"k": self.k} for aid in self.agents})


def _start(*, episode, metrics_logger, **kwargs):
    metrics_logger.log_value("my_starts", 1, reduce="sum")
    metrics_logger.log_value("my_first_obs", float(episode.get_observations(0)[0]), reduce="max")


def _end(*, episode, metrics_logger, prev_episode_chunks=(), **kwargs):
    # RLlib's idiom for a whole episode (its episodes are chunks since the last sample() call).
    metrics_logger.log_value("my_return", episode.get_return() + sum(c.get_return() for c in prev_episode_chunks),
                             reduce="mean")
    metrics_logger.log_value("my_len", len(episode) + sum(len(c) for c in prev_episode_chunks), reduce="mean")
    metrics_logger.log_value("my_ends", 1, reduce="sum")


def _sample_end(*, samples, metrics_logger, **kwargs):
    metrics_logger.log_value("my_samples", 1, reduce="sum")


def _config(config_cls, **env_runners):
    return (config_cls().environment(CountEnv)
            .env_runners(num_envs_per_env_runner=4, rollout_fragment_length=32, **env_runners)
            .training(train_batch_size_per_learner=128, minibatch_size=64, num_epochs=1)
            .debugging(seed=0))


def _train(config, iterations=2):
    algo = config.build_algo()
    try:
        for _ in range(iterations):
            result = algo.train()
        return algo, result
    finally:
        algo.stop()


def test_stock_and_fast_ppo_report_the_same_custom_metrics(ray_session):
    from ray.rllib.algorithms.ppo import PPOConfig

    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    reported = {}
    for cls in (PPOConfig, FastPPOConfig):
        config = _config(cls, num_env_runners=0).callbacks(on_episode_start=_start, on_episode_end=_end,
                                                           on_sample_end=_sample_end)
        _, result = _train(config)
        reported[cls.__name__] = runners = result["env_runners"]
        assert runners["my_ends"] == runners["num_episodes"]  # one on_episode_end per finished episode
        assert runners["my_starts"] >= runners["my_ends"]
    stock, fast = reported["PPOConfig"], reported["FastPPOConfig"]
    for key in ("my_return", "my_first_obs", "my_samples"):
        assert stock[key] == fast[key], key
    assert fast["my_return"] == LENGTH and fast["my_samples"] == 1
    # Each side's len() agrees with its own episode_len_mean. Stock RLlib 2.60 counts a step more for episodes cut
    # by a sample() boundary, in both (5.17 for these 5-step episodes); the columnar runner counts the episode's.
    assert stock["my_len"] == stock["episode_len_mean"] and fast["my_len"] == fast["episode_len_mean"] == LENGTH


class Recorder(RLlibCallback):
    """Every runner-side hook, in order, with the keyword arguments RLlib documents."""

    def on_environment_created(self, *, env_runner, metrics_logger, env, env_context, **kwargs):
        metrics_logger.log_value("rec_env_created", 1, reduce="lifetime_sum")

    def on_episode_created(self, *, episode, env_runner, metrics_logger, env, env_index, rl_module, **kwargs):
        assert not episode.is_reset and episode.custom_data == {}
        episode.custom_data["events"] = ["created"]

    def on_episode_start(self, *, episode, env_runner, metrics_logger, env, env_index, rl_module, **kwargs):
        episode.custom_data["events"].append("start")
        assert len(episode) == 0 and episode.get_infos(-1) == {"k": 0}

    def on_episode_step(self, *, episode, env_runner, metrics_logger, env, env_index, rl_module, **kwargs):
        episode.custom_data["events"].append("step")
        assert episode.get_infos(-1)["k"] == len(episode) == episode.get_observations(-1)[0]
        assert episode.get_actions(-1) == episode.get_observations(-1)[1]

    def on_episode_end(self, *, episode, env_runner, metrics_logger, env, env_index, rl_module,
                       prev_episode_chunks, **kwargs):
        events = episode.custom_data["events"]
        assert events == ["created", "start"] + ["step"] * LENGTH, events
        assert episode.is_done and episode.is_terminated and not episode.is_truncated
        # The terminal step: the final observation and info, not the next episode's reset.
        assert episode.get_observations(-1)[0] == LENGTH and episode.get_infos(-1)["final"] == LENGTH
        assert episode.get_rewards(-1) == 1.0 and list(episode.get_rewards()) == [1.0] * LENGTH
        np.testing.assert_array_equal(np.array(episode.get_observations(slice(0, 3)))[:, 0], [0, 1, 2])
        metrics_logger.log_value("rec_episodes", 1, reduce="sum")
        metrics_logger.log_value("rec_final_obs", float(episode.get_observations(-1)[0]), reduce="mean")

    def on_sample_end(self, *, env_runner, metrics_logger, samples, **kwargs):
        metrics_logger.log_value("rec_samples", len(samples), reduce="sum")


@pytest.mark.parametrize("remote", [0, 1])
def test_a_callbacks_class_sees_every_hook_in_order_with_the_terminal_step(ray_session, remote):
    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    _, result = _train(_config(FastPPOConfig, num_env_runners=remote).callbacks(Recorder))
    runners = result["env_runners"]
    assert runners["rec_episodes"] == runners["num_episodes"] > 0
    assert runners["rec_final_obs"] == LENGTH
    assert runners["rec_samples"] >= runners["rec_episodes"] and runners["rec_env_created"] >= 1


def test_fast_dqn_and_evaluation_runners_call_the_callbacks(ray_session):
    from rl_speed.algorithms.fast_dqn import FastDQNConfig

    config = (FastDQNConfig().environment(CountEnv)
              .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=8)
              .training(num_steps_sampled_before_learning_starts=32, train_batch_size=32)
              .evaluation(evaluation_interval=1, evaluation_duration=2, evaluation_duration_unit="episodes")
              .callbacks(Recorder).debugging(seed=0))
    _, result = _train(config, iterations=3)
    assert result["env_runners"]["rec_episodes"] == result["env_runners"]["num_episodes"] > 0
    evaluation = result["evaluation"]["env_runners"]  # RLlib's own sample() on the evaluation runner
    assert evaluation["rec_episodes"] >= 2 and evaluation["rec_final_obs"] == LENGTH


class MultiAgentRecorder(ColumnarCallback):
    def on_episode_start(self, *, episode, metrics_logger, **kwargs):
        episode.custom_data["started"] = True

    def on_episode_step(self, *, episode, metrics_logger, **kwargs):
        metrics_logger.log_value("ma_step_k", episode.get_infos(-1)["a"]["k"], reduce="max")

    def on_episode_end(self, *, episode, metrics_logger, **kwargs):
        assert episode.custom_data["started"] and episode.is_done
        metrics_logger.log_value("ma_return", episode.get_return(), reduce="mean")
        metrics_logger.log_value("ma_len", len(episode), reduce="mean")
        metrics_logger.log_value("ma_final_obs_b", float(episode.get_observations(-1)["b"][0]), reduce="mean")

    def on_sample_columns(self, *, columns, ended, metrics_logger, **kwargs):
        metrics_logger.log_value("ma_hook_ended", len(ended["env_index"]), reduce="sum")
        if len(ended["t"]):
            metrics_logger.log_value("ma_hook_return", float(ended["return"].mean()), reduce="mean")


def test_multi_agent_runner_calls_the_callbacks_with_rllib_episodes(ray_session):
    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    config = (FastPPOConfig().environment(TwoAgentCountEnv)
              .env_runners(num_env_runners=0, num_envs_per_env_runner=2, rollout_fragment_length=16)
              .training(train_batch_size_per_learner=64, minibatch_size=32, num_epochs=1)
              .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=lambda aid, ep, **kw: "p0" if aid == "a" else "p1")
              .callbacks(MultiAgentRecorder).debugging(seed=0))
    _, result = _train(config)
    runners = result["env_runners"]
    assert runners["ma_return"] == 3.0 * LENGTH == runners["ma_hook_return"]
    assert runners["ma_len"] == LENGTH and runners["ma_final_obs_b"] == LENGTH and runners["ma_step_k"] == LENGTH
    assert runners["ma_hook_ended"] == runners["num_episodes"] > 0


class HookOnly(ColumnarCallback):
    def on_sample_columns(self, *, env_runner, metrics_logger, columns, ended, **kwargs):
        assert columns["rewards"].shape == (32, 4)
        for t, lane, length in zip(ended["t"], ended["env_index"], ended["length"]):
            assert columns["terminateds"][t, lane] and columns["obs"][t + 1, lane, 0] == length
        metrics_logger.log_value("hook_ended", len(ended["t"]), reduce="sum")
        metrics_logger.log_value("hook_return", float(ended["return"].mean()), reduce="mean")


def test_on_sample_columns_gets_the_batch_and_its_ended_episodes(ray_session):
    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    algo, result = _train(_config(FastPPOConfig, num_env_runners=0).callbacks(HookOnly))
    runners = result["env_runners"]
    assert runners["hook_ended"] == runners["num_episodes"] > 0 and runners["hook_return"] == LENGTH
    # Only the hook is configured: no per-episode views are built.
    assert algo.env_runner._callback_names == {"on_sample_columns"}
    callbacks = algo.env_runner._episode_callbacks
    assert callbacks.episodes_created == 0 and not callbacks.history.obs


def test_without_callbacks_the_runner_builds_nothing(ray_session):
    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    algo, _ = _train(_config(FastPPOConfig, num_env_runners=0), iterations=1)
    assert algo.env_runner._episode_callbacks is None


def test_lane_info_reads_vector_and_list_infos():
    infos = {"k": np.array([1, 2, 3]), "_k": np.array([True, False, True]),
             "final": {"x": np.array([0, 5, 0]), "_x": np.array([False, True, False])},
             "_final": np.array([False, True, False])}
    assert lane_info(infos, 0) == {"k": 1}
    assert lane_info(infos, 1) == {"final": {"x": 5}}
    assert lane_info([{"a": 1}, {"b": 2}], 1) == {"b": 2}


def test_steps_before_the_kept_history_raise_a_clear_error():
    class Owner:
        observation_space, action_space = CountEnv.observation_space, CountEnv.action_space
        history = StepHistory()
        id_prefix, episodes_created = "test", 0
        length, returns = np.array([0]), np.array([0.0])
        started, start_event, start_time = np.array([False]), np.array([0]), np.array([0.0])

    owner = Owner()
    episode = LaneEpisode(owner, 0)
    with pytest.raises(IndexError, match="no data yet"):
        episode.get_observations(-1)
    owner.start_event[0] = owner.history.add(np.zeros((1, 2)), [{}])
    owner.started[0] = True
    for k in range(1, 4):
        owner.history.add(np.full((1, 2), k), [{}], np.array([0]), np.array([1.0]))
    owner.length[0], owner.returns[0] = 3, 3.0
    assert episode.get_observations(-1)[0] == 3 and episode.get_return() == 3.0 and len(episode) == 3
    owner.history.trim(2)
    assert episode.get_observations(2)[0] == 2
    with pytest.raises(IndexError, match="no longer kept"):
        episode.get_observations(0)
    chunk = episode.to_episode()  # RLlib's episode of the kept steps
    assert chunk.t_started == 2 and len(chunk) == 1
    episode.freeze(terminated=False)  # the lane moves on; the ended episode keeps its figures
    owner.length[0], owner.returns[0], owner.started[0] = 0, 0.0, False
    assert len(episode) == 3 and episode.get_return() == 3.0 and episode.is_truncated and episode.is_reset
