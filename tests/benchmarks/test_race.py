"""The race's judge: the episode log every contender's env writes, the target rule, the permutation test; the slow
tests are the learning-level equivalence of FastPPO and stock PPO, and of FastDQN and stock DQN, on CartPole."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from benchmarks.race.judge import WINDOW, EpisodeJudge, judged_id, reached
from benchmarks.race.stats import _summary, permutation_p


def test_judge_logs_every_finished_episode_with_the_shared_step_count():
    EpisodeJudge.begin()
    envs = [gym.make(judged_id("CartPole-v1")) for _ in range(2)]
    lengths = []
    for env in envs:
        env.reset(seed=0)
        steps, done = 0, False
        while not done:
            _, _, terminated, truncated, _ = env.step(0)
            steps, done = steps + 1, terminated or truncated
        lengths.append(steps)
    assert [r for _, _, r in EpisodeJudge.log] == [float(n) for n in lengths]  # CartPole: reward 1 per step
    assert [s for _, s, _ in EpisodeJudge.log] == [lengths[0], sum(lengths)]  # steps of all instances
    assert EpisodeJudge.log[0][0] <= EpisodeJudge.log[1][0]


def test_target_is_the_running_mean_of_the_last_window():
    log = [(float(i), 10 * i, 100.0) for i in range(WINDOW - 1)] + [(99.0, 1000, 500.0)]
    assert reached(log, 120.0) == (99.0, 1000)  # mean (19 * 100 + 500) / 20 = 120
    assert reached(log, 121.0) is None
    assert reached(log[:-1], 0.0) is None  # fewer than WINDOW episodes: no mean yet
    assert reached(log, 200.0, window=1) == (99.0, 1000)  # a task's own window


def test_grid_arena_task_runs_both_rllib_contenders_on_the_batched_form():
    from benchmarks.race.contenders import TASKS, _contenders, rllib_config, zoo_in_rllib

    task = TASKS["rl_speed/GridArena-v0"]
    assert set(_contenders(task, "ppo", 10)) == {"FastPPO (ours)", "FastPPO (grid_ppo.yaml)",
                                                 "PPO (grid_ppo.yaml)"}  # no SB3 form
    settings = zoo_in_rllib(task)
    for algo in ("fast", "stock"):
        config = rllib_config(algo, task.env_id, settings, seed=0)
        assert config.gym_env_vectorize_mode == "vector_entry_point" and config.num_envs_per_env_runner == 192
        assert config.train_batch_size_per_learner == 192 * 64 and config.minibatch_size == 3072
        assert config.env_config == task.env_config and config.model_config["fcnet_hiddens"] == [128, 128]
        config.validate()  # the judged id's single form is the MultiAgentEnv; the runners build the vector form


@pytest.mark.parametrize("task_name", ["CartPole-v1", "Acrobot-v1", "rl_speed/Snake-v0", "rl_speed/GridArena-v0"])
def test_ours_rows_are_fast_ppo_configs_that_carry_their_settings(task_name):
    """An "ours" row is the task's shared settings with FastPPO's own over them; each of its keys reaches the
    config (nothing silently dropped) and the config validates."""
    from benchmarks.race.contenders import TASKS, rllib_config, zoo_in_rllib

    task = TASKS[task_name]
    settings = {**zoo_in_rllib(task), **task.ours}
    config = rllib_config("fast", task.env_id, settings, seed=0)
    config.validate()
    assert config.num_envs_per_env_runner == settings["num_envs"]
    assert config.rollout_fragment_length == settings["fragment"] and config.minibatch_size == settings["minibatch"]
    assert config.mixed_precision == settings.get("mixed_precision", "off")
    assert config.vf_loss_coeff == settings.get("vf_loss_coeff", 0.5 if settings["sb3_loss"] else 1.0)
    assert config.env_config == task.env_config
    assert config.num_epochs == settings["epochs"] and config.lr == settings["lr"]


def test_summary_reads_unambiguously_with_negative_values():
    assert _summary([3.0, 1.0, 2.0], ".2f") == "2.00 (1.00-3.00)"
    assert _summary([-19.05, -15.6, -17.32], ".2f") == "-17.32 (-19.05 to -15.60)"


def test_permutation_p():
    assert permutation_p([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == pytest.approx(1.0)
    # 5 vs 5 fully separated: only the observed split and its mirror are as extreme, 2 of C(10, 5) = 252
    assert permutation_p([1.0, 2, 3, 4, 5], [10.0, 11, 12, 13, 14]) == pytest.approx(2 / 252)


def test_vector_judge_skips_reset_steps_and_logs_each_lane():
    import numpy as np

    from benchmarks.race.judge import VectorEpisodeJudge, best_mean
    from rl_speed_envs import SnakeVectorEnv

    EpisodeJudge.begin()
    env = VectorEpisodeJudge(SnakeVectorEnv(num_envs=4, height=6, width=6, max_steps_without_food=5))
    env.reset(seed=0)
    raw_steps, resetting, returns = 0, np.zeros(4, bool), np.zeros(4)
    finished = []
    for _ in range(40):
        _, rewards, terminated, truncated, _ = env.step(np.zeros(4, np.int64))
        raw_steps += int((~resetting).sum())
        returns += np.where(resetting, 0.0, rewards)
        done = (terminated | truncated) & ~resetting
        finished += list(returns[done])
        returns[done] = 0.0
        resetting = terminated | truncated
    assert EpisodeJudge.steps == raw_steps  # NEXT_STEP reset steps are not counted
    assert [r for _, _, r in EpisodeJudge.log] == pytest.approx(finished)
    assert best_mean(EpisodeJudge.log[:WINDOW - 1]) == float("-inf")


@pytest.mark.parametrize("life_episodes", [False, True])
def test_the_judge_counts_whole_atari_games_at_their_unclipped_score(life_episodes):
    pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")
    import numpy as np

    from benchmarks.race.judge import EpisodeJudge, VectorEpisodeJudge
    from rl_speed_envs.atari import AtariEnv, AtariVectorEnv

    EpisodeJudge.begin()
    env = VectorEpisodeJudge(AtariVectorEnv(4, game="breakout", life_episodes=life_episodes))
    games, scores, episodes = [], np.zeros(4), 0
    try:
        env.reset(seed=0)
        rng = np.random.default_rng(0)
        for _ in range(1500):
            _, rewards, terminated, truncated, info = env.step(rng.integers(0, 4, 4))
            assert set(np.unique(rewards)) <= {0.0, 1.0}  # trained on clipped rewards
            scores += info["game_reward"]
            games += list(scores[info["game_over"]])
            scores[info["game_over"]] = 0.0
            episodes += int((terminated | truncated).sum())
    finally:
        env.close()
    assert [r for _, _, r in EpisodeJudge.log] == games and len(games) >= 2
    assert max(games) > 1  # whole games, bricks of the upper rows worth more than one point
    assert (episodes >= 4 * len(games)) if life_episodes else episodes == len(games)  # five lives a game
    EpisodeJudge.begin()
    scalar = EpisodeJudge(AtariEnv(game="breakout", life_episodes=True))
    try:
        scalar.reset(seed=0)
        score, lives_lost = 0.0, 0
        while not EpisodeJudge.log:
            _, _, terminated, _, info = scalar.step(int(rng.integers(0, 4)))
            score += info["game_reward"]
            lives_lost += terminated
    finally:
        scalar.close()
    assert EpisodeJudge.log[0][2] == score and lives_lost == 5  # the scalar form: one game of five episodes


def test_judge_files_merge_processes_in_time_order_with_summed_steps(tmp_path):
    from benchmarks.race.judge import JudgeFiles

    (tmp_path / "101.csv").write_text("1.0,100,-21.0\n3.0,250,-20.0\n")
    (tmp_path / "202.csv").write_text("2.0,80,-19.0\n")
    assert JudgeFiles(str(tmp_path), 0.0).read() == [(1.0, 100, -21.0), (2.0, 180, -19.0), (3.0, 330, -20.0)]


def test_the_race_clock_counts_from_the_process_start_not_from_when_it_is_read():
    """The time to the target is from process start: what a process did before it read the clock (here a 1 s sleep
    standing in for RLlib's and torch's imports) is on it."""
    script = ("import time; time.sleep(1.0); from benchmarks.race.judge import process_start; "
              "print(time.monotonic() - process_start())")
    elapsed = float(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                   cwd=Path(__file__).parents[2]).stdout)
    assert 1.0 <= elapsed < 30.0


def test_judge_files_collect_the_episodes_of_remote_env_runners(ray_session, tmp_path):
    """A contender whose env runner is a Ray actor: its judge writes to the files the driver reads, from the
    runner's process."""
    import os
    import time

    from rl_speed.algorithms.fast_ppo import FastPPOConfig
    from benchmarks.race.judge import JudgeFiles

    files = JudgeFiles(str(tmp_path), time.monotonic())
    config = (FastPPOConfig().environment(judged_id("CartPole-v1", files))
              .env_runners(num_env_runners=1, num_envs_per_env_runner=4, rollout_fragment_length=64)
              .training(train_batch_size_per_learner=256, minibatch_size=128, num_epochs=1))
    algo = config.build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    log = files.read()
    writers = {path.stem for path in tmp_path.glob("*.csv")}
    assert log and str(os.getpid()) not in writers  # written by the runner, not the driver
    assert all(0 < t < time.monotonic() - files.start for t, _, _ in log)
    assert [s for _, s, _ in log] == sorted(s for _, s, _ in log)
    assert log[-1][1] <= result["num_env_steps_sampled_lifetime"]
    # CartPole: one reward per step; the count also holds the steps of episodes still running
    assert all(sum(r for _, _, r in log[:i + 1]) <= steps for i, (_, steps, _) in enumerate(log))

def _env_steps_to_target(family: str, settings: dict, task, seeds: int = 5, stock_extra: dict | None = None,
                         fast_extra: dict | None = None) -> dict[str, list[float]]:
    """Env steps to the judge's target per seed for rl_speed's and stock RLlib's algorithm at the same settings
    (``stock_extra`` / ``fast_extra``: settings of one side only, for an aligned comparison); a seed that misses it
    within ``task.max_steps`` counts as ``task.max_steps`` (censored, which favours neither side). The time limit
    is generous so that the step cap is what ends a run that misses."""
    import torch

    from benchmarks.race.contenders import env_steps_to_target

    torch.set_num_threads(1)
    steps = {"fast": [], "stock": []}
    for seed in range(seeds):
        for algo in steps:
            own = {**settings, **((stock_extra if algo == "stock" else fast_extra) or {})}
            steps[algo].append(env_steps_to_target(algo, task, own, seed, max_seconds=900, family=family))
    return steps


def _assert_equivalent(steps: dict[str, list[float]], names: tuple[str, str]) -> None:
    """The permutation test on mean log(env steps) does not separate the two (p > 0.05) and the medians are within
    1.5x of each other."""
    import math
    import statistics

    p = permutation_p([math.log(x) for x in steps["fast"]], [math.log(x) for x in steps["stock"]])
    ratio = statistics.median(steps["fast"]) / statistics.median(steps["stock"])
    print(f"env steps to the target: {names[0]} {sorted(steps['fast'])}, {names[1]} {sorted(steps['stock'])}; "
          f"median ratio {ratio:.2f}, p = {p:.3f}")
    assert p > 0.05 and 1 / 1.5 <= ratio <= 1.5


@pytest.mark.slow
def test_fast_ppo_learns_cartpole_in_as_many_env_steps_as_stock_ppo(ray_session):
    """Learning-level equivalence: rl-zoo's CartPole PPO settings (SB3's loss), 10 seeds each, env steps to the
    judge's target of 475 within the task's 200,000 steps, with the two stated differences of the batch layout
    aligned (docs/studies/time-to-a-score.md, "The CartPole sample gap"):

    * advantages standardized over real steps on both sides (``real_steps_ppo_learner``): RLlib's own rule also
      counts the bootstrap row it appends to each episode chunk;
    * the same number of minibatch updates per iteration: RLlib's iterator cycles until every row, appended rows
      included, has been seen ``num_epochs`` times, 22 minibatches of 256 per iteration here (counted) where
      FastPPO's 256 real rows make 20; so FastPPO runs 22 epochs.

    With only the first aligned, 10 seeds read median ratio 1.12, p = 0.286 once and, after a float-level change in
    the runners' sampling re-drew every trajectory, 1.15, p = 0.018 (the gap the second difference predicts)."""
    from benchmarks.race.contenders import TASKS, zoo_in_rllib
    from benchmarks.race.race import real_steps_ppo_learner

    task = TASKS["CartPole-v1"]
    settings = zoo_in_rllib(task)
    steps = _env_steps_to_target("ppo", settings, task, seeds=10,
                                 stock_extra={"learner_class": real_steps_ppo_learner()},
                                 fast_extra={"epochs": settings["epochs"] + 2})
    _assert_equivalent(steps, ("FastPPO (22 epochs)", "PPO (real-step standardization)"))


@pytest.mark.slow
def test_fast_dqn_learns_cartpole_in_as_many_env_steps_as_stock_dqn(ray_session):
    """Learning-level equivalence: ``tuned_examples/cartpole_fastdqn.yaml``'s settings (double Q, prioritized replay,
    8 envs; rl-zoo's DQN settings reach no target within minutes on either side) with 1-step returns, 5 seeds each, env
    steps to a running mean of 200 within 100,000 steps. FastDQN normalizes prioritized replay's importance weights
    as RLlib does (over the whole buffer, ``importance_weights: buffer``): with its default (over the sampled batch)
    the weights average about 7x RLlib's and FastDQN needed 0.32x stock's env steps (docs/studies/time-to-a-score.md). With the
    example's 3-step returns stock DQN reached 475 in none of 5 seeds (FastDQN: 5 of 5); with 1-step returns neither
    reached 475 within 100,000 steps in 4 of 5 seeds, which tells nothing apart. So the two are compared at 1-step
    returns and a target both reach."""
    import dataclasses

    from benchmarks.race.contenders import CARTPOLE_FASTDQN, TASKS

    task = dataclasses.replace(TASKS["CartPole-v1"], target=200.0, max_steps=100_000)
    settings = {**CARTPOLE_FASTDQN, "n_step": 1, "importance_weights": "buffer"}
    _assert_equivalent(_env_steps_to_target("dqn", settings, task), ("FastDQN (buffer-wide weights)", "DQN"))


def test_zoo_settings_map_sb3_loss_on_both_rllib_contenders():
    """SB3's PPO loss: value weight 0.5, no KL term, grad-norm clip 0.5 and no value-loss clipping (RLlib's
    vf_clip_param of 10 cost FastPPO 1.4x the env steps on CartPole: docs/studies/time-to-a-score.md)."""
    import math

    from benchmarks.race.contenders import TASKS, rllib_config, zoo_in_rllib

    task = TASKS["CartPole-v1"]
    for algo in ("fast", "stock"):
        config = rllib_config(algo, task.env_id, zoo_in_rllib(task), seed=0)
        assert math.isinf(config.vf_clip_param) and config.vf_loss_coeff == 0.5 and config.grad_clip == 0.5
        assert not config.use_kl_loss
        assert rllib_config(algo, task.env_id, {**zoo_in_rllib(task), "vf_clip": 10.0}, 0).vf_clip_param == 10.0


def test_ablation_learner_standardizes_stock_advantages_over_real_steps_only(ray_session):
    """``real_steps_ppo_learner``: stock PPO's learner pipeline, its advantages standardized over the loss mask's rows
    (FastPPO's rule), where RLlib's GeneralAdvantageEstimation also counts the bootstrap row of each episode chunk."""
    import torch

    from benchmarks.race.contenders import TASKS, rllib_config, zoo_in_rllib
    from benchmarks.race.race import real_steps_ppo_learner

    task = TASKS["CartPole-v1"]
    outputs = {}
    for name, extra in (("stock", {}), ("ablation", {"learner_class": real_steps_ppo_learner()})):
        algo = rllib_config("stock", task.env_id, {**zoo_in_rllib(task), **extra}, seed=0).build_algo()
        try:
            learner = algo.learner_group._learner
            episodes = algo.env_runner.sample(num_timesteps=256, random_actions=True)
            batch = learner._learner_connector(rl_module=learner.module, batch={}, episodes=episodes,
                                               shared_data={}, metrics=learner.metrics)["default_policy"]
            outputs[name] = (batch["advantages"], torch.as_tensor(batch["loss_mask"]).bool())
        finally:
            algo.stop()
    for name, (advantages, real) in outputs.items():
        mean, std = float(advantages[real].mean()), float(advantages[real].std(correction=0))
        if name == "ablation":
            assert abs(mean) < 1e-5 and abs(std - 1) < 1e-4 and not advantages[~real].any()
        else:  # RLlib's: the appended rows are in its statistics, so the real steps' are off zero mean
            assert abs(mean) > 1e-3


def test_dqn_importance_weights_setting_reaches_fastdqn_and_stock_refuses_what_it_cannot_do():
    from benchmarks.race.contenders import CARTPOLE_FASTDQN, rllib_dqn_config

    fast = rllib_dqn_config("fast", "CartPole-v1", {**CARTPOLE_FASTDQN, "importance_weights": "buffer"}, 0)
    assert fast.replay_buffer_config["importance_weights"] == "buffer"
    assert rllib_dqn_config("stock", "CartPole-v1", {**CARTPOLE_FASTDQN, "importance_weights": "buffer"}, 0)
    with pytest.raises(ValueError, match="whole buffer only"):
        rllib_dqn_config("stock", "CartPole-v1", {**CARTPOLE_FASTDQN, "importance_weights": "batch"}, 0)
