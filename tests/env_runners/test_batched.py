"""BatchedEnvRunner: columns match a plain stepping of the same vector env, NEXT_STEP resets are masked, and
truncated episodes keep their true final observation for bootstrapping."""

from __future__ import annotations

import time

import numpy as np
import pytest

import rl_speed
from rl_speed.columns import check, next_obs
from rl_speed_envs import SnakeVectorEnv

ENV_CONFIG = {"height": 5, "width": 5, "max_steps_without_food": 6, "observation": "flat"}


def _runner(algo: str = "DQN", n: int = 8, t: int = 40, **env_runner_kwargs):
    rl_speed.register()
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.ppo import PPOConfig

    from rl_speed.env_runners import BatchedEnvRunner

    cls = DQNConfig if algo == "DQN" else PPOConfig
    config = (cls().environment("rl_speed/Snake-v0", env_config=ENV_CONFIG)
              .env_runners(env_runner_cls=BatchedEnvRunner, num_envs_per_env_runner=n, rollout_fragment_length=t,
                           gym_env_vectorize_mode="vector_entry_point", **env_runner_kwargs))
    return BatchedEnvRunner(config=config)


def test_random_action_columns_replay_exactly_on_a_fresh_env():
    runner = _runner()
    runner.env.unwrapped.reset(seed=5)
    runner._obs = runner.env.unwrapped._observe()
    cols = runner.sample_columns(random_actions=True)
    check(cols)
    ref = SnakeVectorEnv(num_envs=8, **ENV_CONFIG)
    obs, _ = ref.reset(seed=5)
    resetting = np.zeros(8, dtype=bool)
    for t in range(40):
        np.testing.assert_array_equal(cols["obs"][t], obs)
        obs, rewards, terminated, truncated, _ = ref.step(cols["actions"][t])
        np.testing.assert_array_equal(cols["rewards"][t], rewards)
        np.testing.assert_array_equal(cols["terminateds"][t], terminated)
        np.testing.assert_array_equal(cols["truncateds"][t], truncated)
        np.testing.assert_array_equal(cols["valid"][t], ~resetting)  # reset steps are masked
        resetting = terminated | truncated
    np.testing.assert_array_equal(cols["obs"][40], obs)


def test_done_steps_keep_the_final_observation_and_reset_steps_are_invalid():
    runner = _runner(t=200)
    runner.env.unwrapped.reset(seed=9)
    runner._obs = runner.env.unwrapped._observe()
    cols = runner.sample_columns(random_actions=True)
    ref = SnakeVectorEnv(num_envs=8, **ENV_CONFIG)
    ref.reset(seed=9)
    final_obs, observed = {}, []
    for t in range(200):  # what the env itself returned at each episode end
        obs, _, terminated, truncated, _ = ref.step(cols["actions"][t])
        observed.append(obs)
        for lane in np.flatnonzero(terminated | truncated):
            final_obs[(t, lane)] = obs[lane]
    nxt = next_obs(cols)
    truncations = terminations = 0
    for (t, lane), obs in final_obs.items():
        # The next observation of an ending step is the episode's true final observation ...
        np.testing.assert_array_equal(nxt[t, lane], obs)
        if t + 1 < 200:
            # ... and the reset only comes on the following step, which is masked out.
            assert not cols["valid"][t + 1, lane]
            reset_obs = observed[t + 1][lane]
            np.testing.assert_array_equal(cols["obs"][t + 2, lane], reset_obs)
            if not np.array_equal(reset_obs, obs):  # a new board can, rarely, look like the last one's end
                assert not np.array_equal(cols["obs"][t + 2, lane], obs)
        truncations += bool(cols["truncateds"][t, lane])
        terminations += bool(cols["terminateds"][t, lane])
    assert truncations > 0 and terminations > 0


def test_metrics_use_rllib_keys_and_count_only_real_steps():
    runner = _runner(t=100)
    cols = runner.sample_columns(random_actions=True)
    metrics = runner.get_metrics()
    assert metrics["num_env_steps_sampled"].peek() == cols["valid"].sum()
    assert metrics["num_env_steps_sampled_lifetime"].peek() == cols["valid"].sum()
    ended = ((cols["terminateds"] | cols["truncateds"]) & cols["valid"]).sum()
    assert metrics["num_episodes"].peek() == ended
    assert -1.0 <= metrics["episode_return_mean"].peek() < 5 and metrics["episode_len_mean"].peek() >= 1


def test_phase_timers_use_rllib_keys_with_seconds_per_step():
    """env_step_timer and rlmodule_inference_timer are RLlib's runner keys: seconds per env step / forward call."""
    runner = _runner(algo="PPO", t=20)
    start = time.perf_counter()
    runner.sample_columns()
    per_step_bound = (time.perf_counter() - start) / 20
    metrics = runner.get_metrics()
    env_step, inference = metrics["env_step_timer"].peek(), metrics["rlmodule_inference_timer"].peek()
    assert 0 < env_step < per_step_bound and 0 < inference < per_step_bound
    assert env_step + inference < per_step_bound  # two disjoint parts of one step


@pytest.mark.parametrize("algo", ["DQN", "PPO"])
def test_module_actions_and_policy_outputs(algo):
    runner = _runner(algo, t=16)
    cols = runner.sample_columns()
    assert cols["actions"].dtype == np.int64 and ((cols["actions"] >= 0) & (cols["actions"] < 4)).all()
    if algo == "PPO":
        assert cols["action_logp"].shape == (16, 8) and (cols["action_logp"] <= 0).all()
    consecutive = runner.sample_columns()
    np.testing.assert_array_equal(consecutive["obs"][0], cols["obs"][-1])  # episodes continue across calls



def test_rllib_sample_returns_episodes_and_shares_the_env_with_the_columnar_path():
    runner = _runner("PPO", t=16)
    runner.sample_columns()
    episodes = runner.sample(num_episodes=3, explore=False)  # RLlib's own sample(): evaluation calls it
    assert len(episodes) >= 3 and all(e.is_done for e in episodes)
    metrics = runner.get_metrics()
    assert metrics["num_episodes"].peek() >= 3
    columns = runner.sample_columns()  # starts again from a reset: every lane's first observation is a new episode
    check(columns)
    assert columns["valid"][0].all()
    assert runner.sample(num_timesteps=32, explore=True)  # and back: a fresh set of episodes


def _cartpole_runners(n: int, fragment: int, window: int):
    """RLlib's stock runner and a BatchedEnvRunner on the same seeded CartPole, acting with the same weights."""
    rl_speed.register()
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from rl_speed.env_runners import BatchedEnvRunner

    config = (PPOConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=n, rollout_fragment_length=fragment)
              .reporting(metrics_num_episodes_for_smoothing=window).debugging(seed=7))
    stock = SingleAgentEnvRunner(config=config)
    ours = BatchedEnvRunner(config=config.copy(copy_frozen=False).env_runners(env_runner_cls=BatchedEnvRunner))
    ours.module.load_state_dict(stock.module.state_dict())
    return stock, ours


EPISODE_KEYS = ("episode_return_mean", "episode_return_min", "episode_return_max", "episode_len_mean",
                "episode_len_min", "episode_len_max", "num_episodes")


def test_episode_metrics_equal_the_stock_runners_on_the_same_episodes():
    # Same seed, same greedy policy: the first 100 steps finish the same 8 episodes on both; the smoothing window
    # (6) keeps the last 6 of them on both.
    stock, ours = _cartpole_runners(n=4, fragment=25, window=6)
    stock.sample(num_timesteps=100, explore=False)
    ours.sample_columns(explore=False)
    expected, got = stock.get_metrics(), ours.get_metrics()
    assert expected["num_episodes"].peek() == 8
    for key in EPISODE_KEYS:
        assert got[key].peek() == pytest.approx(expected[key].peek()), key
    for key, sub in (("agent_episode_return_mean", "default_agent"), ("module_episode_return_mean", "default_policy")):
        assert got[key][sub].peek() == pytest.approx(expected[key][sub].peek()), key


def test_episode_metrics_cover_the_episodes_since_the_last_call_as_stocks_do():
    """Each call reports the episodes finished since the previous call (the last `window` of them), NaN when none
    did: what RLlib's runner reports, not a window carried across iterations."""
    _, ours = _cartpole_runners(n=4, fragment=8, window=3)
    finished: list[float] = []
    original = ours._track_episodes

    def track(rewards, done, valid):
        before = ours._episode_return.copy()
        original(rewards, done, valid)
        ended = done & valid
        finished.extend((before + np.where(valid, rewards, 0.0))[ended])

    ours._track_episodes = track
    saw_nan = saw_values = False
    for _ in range(12):
        start = len(finished)
        ours.sample_columns(explore=False)
        value = ours.get_metrics()["episode_return_mean"].peek()
        new = finished[start:]
        if new:
            saw_values = True
            assert value == pytest.approx(np.mean(new[-3:]))
        else:
            saw_nan = True
            assert np.isnan(value)
    assert saw_nan and saw_values


@pytest.mark.parametrize("setting, low, high", [(True, -1.0, 1.0), (2.5, -2.5, 2.5)])
def test_clip_rewards_clips_the_training_columns_not_the_episode_returns(setting, low, high):
    rl_speed.register()
    from ray.rllib.algorithms.ppo import PPOConfig

    from rl_speed.env_runners import BatchedEnvRunner

    config = (PPOConfig().environment("Pendulum-v1").env_runners(num_envs_per_env_runner=2,
                                                                  rollout_fragment_length=250)
              .environment(clip_rewards=setting))
    runner = BatchedEnvRunner(config=config)
    try:
        cols = runner.sample_columns(random_actions=True)
        rewards = cols["rewards"][cols["valid"]]
        assert rewards.min() >= low and rewards.max() <= high and (rewards == low).any()  # Pendulum's go to -16
        assert runner.get_metrics()["episode_return_mean"].peek() < -200 * abs(low)  # raw 200-step returns
    finally:
        runner.stop()


def _atari_runner(prefetch: bool = True, **callbacks):
    rl_speed.register()
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rl_speed.algorithms.fast_ppo import FastPPOConfig
    from rl_speed.env_runners import BatchedEnvRunner
    from rl_speed.modules.pixels import NatureActorCritic

    cls = BatchedEnvRunner if prefetch else type("NoPrefetch", (BatchedEnvRunner,), {"prefetch_first_reset": False})
    config = (FastPPOConfig()
              .environment("rl_speed/Atari-v0", env_config={"game": "pong", "max_num_frames_per_episode": 200})
              .env_runners(num_env_runners=0, num_envs_per_env_runner=2, rollout_fragment_length=8,
                           gym_env_vectorize_mode="vector_entry_point")
              .rl_module(rl_module_spec=RLModuleSpec(module_class=NatureActorCritic))
              .callbacks(**callbacks)
              .debugging(seed=3))
    return cls(config=config)


def test_the_first_seeded_reset_starts_with_the_env_and_changes_nothing_sampled():
    pytest.importorskip("ale_py", reason="the [atari] extra is not installed")
    early, plain = _atari_runner(), _atari_runner(prefetch=False)
    try:
        env = early.env.unwrapped
        assert env._prefetched is not None and plain.env.unwrapped._prefetched is None
        resets = []
        env._reset = lambda seed, reset=env._reset: resets.append(seed) or reset(seed)
        plain.module.load_state_dict(early.module.state_dict())
        got, expected = early.sample_columns(explore=False), plain.sample_columns(explore=False)
        assert resets == []  # the first sample took the prefetched reset
        for key in ("obs", "actions", "rewards", "valid"):
            np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
        # RLlib's sample() (evaluation) starts over from the same seeded reset: the prefetched one, where unused
        fresh = _atari_runner()
        try:
            first = [episode.get_observations(0) for episode in fresh.sample(num_timesteps=2, explore=False)]
            again = [episode.get_observations(0) for episode in plain.sample(num_timesteps=2, explore=False)]
            np.testing.assert_array_equal(np.stack(first), np.stack(again))
        finally:
            fresh.stop()
    finally:
        early.stop()
        plain.stop()


def test_a_runner_side_callback_keeps_the_first_reset_where_rllib_makes_it():
    pytest.importorskip("ale_py", reason="the [atari] extra is not installed")
    created = []
    runner = _atari_runner(on_episode_created=lambda **kwargs: created.append(kwargs["env_index"]))
    try:
        assert runner.env.unwrapped._prefetched is None  # on_episode_created runs before the env's reset, as in RLlib
        runner.sample_columns(explore=False)
        assert created
    finally:
        runner.stop()


def test_a_new_env_from_make_env_starts_from_the_seeded_reset_of_the_first():
    # RLlib's documented flow: change the runner's env_config, call make_env(); its sample() then starts over from a
    # reset seeded as the first one. The columnar path does the same.
    rl_speed.register()
    from ray.rllib.algorithms.ppo import PPOConfig

    from rl_speed.env_runners import BatchedEnvRunner

    config = (PPOConfig().environment("rl_speed/Snake-v0", env_config=ENV_CONFIG)
              .env_runners(env_runner_cls=BatchedEnvRunner, num_envs_per_env_runner=4, rollout_fragment_length=5,
                           gym_env_vectorize_mode="vector_entry_point")
              .debugging(seed=11))
    runner = BatchedEnvRunner(config=config)
    try:
        first = runner.sample_columns()["obs"][0]
        runner.sample_columns()
        runner.make_env()
        again = runner.sample_columns()  # (it raised "call reset() before step()" before the runner started over)
        np.testing.assert_array_equal(again["obs"][0], first)
    finally:
        runner.stop()


def test_an_env_that_reports_no_games_gets_no_game_key():
    runner = _runner()
    try:
        runner.sample_columns(random_actions=True)
        assert "game_return_mean" not in runner.get_metrics()
    finally:
        runner.stop()


def _breakout_life_runner(lanes: int):
    """A Breakout runner whose episodes are lives, its env wrapped by the race's judge (which logs whole games)."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from benchmarks.race.judge import EpisodeJudge, judged_id
    from rl_speed.algorithms.fast_ppo import FastPPOConfig
    from rl_speed.env_runners import BatchedEnvRunner
    from rl_speed.modules.pixels import NatureActorCritic

    rl_speed.register()
    EpisodeJudge.begin()
    config = (FastPPOConfig()
              .environment(judged_id("rl_speed/Atari-v0"), env_config={"game": "breakout", "life_episodes": True})
              .env_runners(num_env_runners=0, num_envs_per_env_runner=lanes, rollout_fragment_length=256,
                           gym_env_vectorize_mode="vector_entry_point")
              .rl_module(rl_module_spec=RLModuleSpec(module_class=NatureActorCritic))
              .debugging(seed=0))
    return BatchedEnvRunner(config=config)


def test_whole_games_score_as_the_races_judge_counts_them_when_an_episode_is_a_life():
    """Under Atari's ``life_episodes`` an episode is one life and the game plays on: ``game_return_mean`` is the mean
    score of the whole games finished, counted by the runner as the race's judge counts them on the same steps
    (every step's ``game_reward``, a game ends at ``game_over``)."""
    pytest.importorskip("ale_py", reason="the [atari] extra is not installed")
    from benchmarks.race.judge import EpisodeJudge

    runner = _breakout_life_runner(lanes=4)
    try:
        lives = 0
        for _ in range(6):  # random play: a life lasts about 40-60 steps, a game five of them
            lives += int(runner.sample_columns(random_actions=True)["terminateds"].sum())
            if len(EpisodeJudge.log) >= 3:
                break
        games = [score for _, _, score in EpisodeJudge.log]
        assert len(games) >= 3 and lives > len(games)  # the episodes are lives
        # (random play's scores are often all 0: the games' mean is checked against the judge's, not against a life's)
        assert float(runner.get_metrics()["game_return_mean"]) == pytest.approx(np.mean(games))
        runner.sample_columns(random_actions=True)
        # the window restarts at each call, as the episode keys' does: the games finished since the last call
        assert float(runner.get_metrics()["game_return_mean"]) == pytest.approx(
            np.mean([score for _, _, score in EpisodeJudge.log[len(games):]]) if len(EpisodeJudge.log) > len(games)
            else np.nan, nan_ok=True)
    finally:
        runner.stop()


def test_rllibs_own_sample_path_also_reports_whole_games():
    """Evaluation samples through RLlib's ``sample()`` (episode objects): RLlib reports a life's return there, and the
    runner adds ``game_return_mean`` from the same infos, as the judge counts the games."""
    pytest.importorskip("ale_py", reason="the [atari] extra is not installed")
    from benchmarks.race.judge import EpisodeJudge

    runner = _breakout_life_runner(lanes=2)
    try:
        lives = 0
        for _ in range(8):  # random play: a game is five lives of about 40-60 steps
            lives += sum(episode.is_done for episode in runner.sample(num_timesteps=512, random_actions=True))
            if len(EpisodeJudge.log) >= 2:
                break
        games = [score for _, _, score in EpisodeJudge.log]
        assert len(games) >= 2 and lives > len(games)  # RLlib's episodes are lives here
        # (random play's scores are often all 0: the games' mean is checked against the judge's, not against a life's)
        assert float(runner.get_metrics()["game_return_mean"]) == pytest.approx(np.mean(games))
    finally:
        runner.stop()
