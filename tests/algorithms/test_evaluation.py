"""RLlib's evaluation works for FastPPO and FastDQN: the evaluation runners use RLlib's own ``sample()`` (episodes)
on the same BatchedEnvRunner class that trains on columns, so every evaluation setting RLlib has keeps its meaning."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("ray.rllib")

from rl_speed.algorithms.fast_dqn import FastDQNConfig  # noqa: E402
from rl_speed.algorithms.fast_ppo import FastPPOConfig  # noqa: E402

SETTINGS = {
    "episodes_local": dict(evaluation_interval=1, evaluation_duration=3, evaluation_duration_unit="episodes"),
    "timesteps_local": dict(evaluation_interval=1, evaluation_duration=400, evaluation_duration_unit="timesteps"),
    "episodes_remote": dict(evaluation_interval=1, evaluation_duration=4, evaluation_num_env_runners=1),
    "parallel_to_training": dict(evaluation_interval=1, evaluation_duration=2, evaluation_num_env_runners=1,
                                 evaluation_parallel_to_training=True),
}


def _config(algo: str, **evaluation):
    if algo == "FastPPO":
        config = FastPPOConfig().training(train_batch_size_per_learner=128, minibatch_size=64, num_epochs=1)
    else:
        config = FastDQNConfig().training(train_batch_size_per_learner=32, num_steps_sampled_before_learning_starts=0,
                                          replay_buffer_config={"type": "EpisodeReplayBuffer", "capacity": 1000})
    return (config.environment("CartPole-v1")
            .env_runners(num_env_runners=0, num_envs_per_env_runner=8, rollout_fragment_length=16)
            .rl_module(model_config={"fcnet_hiddens": [16]})
            .evaluation(**evaluation).debugging(seed=0))


def _check_evaluation(results: dict, unit: str, duration: int):
    runners = results["env_runners"]
    assert math.isfinite(runners["episode_return_mean"]) and runners["episode_return_mean"] > 0
    if unit == "episodes":
        assert runners["num_episodes"] >= duration
    else:
        assert runners["num_env_steps_sampled"] >= duration


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("algo", ["FastPPO", "FastDQN"])
def test_train_reports_evaluation_results(ray_session, algo, setting):
    evaluation = SETTINGS[setting]
    algo_ = _config(algo, **evaluation).build_algo()
    try:
        result = algo_.train()
        if evaluation.get("evaluation_parallel_to_training"):
            result = algo_.train()  # the parallel evaluation of an iteration may report with the next one
        _check_evaluation(result["evaluation"], evaluation.get("evaluation_duration_unit", "episodes"),
                          evaluation["evaluation_duration"])
        assert math.isfinite(result["env_runners"]["num_env_steps_sampled_lifetime"])  # training still columnar
        assert "rl_speed_profile" in result
    finally:
        algo_.stop()


@pytest.mark.parametrize("algo", ["FastPPO", "FastDQN"])
def test_algorithm_evaluate_without_training(ray_session, algo):
    algo_ = _config(algo, evaluation_duration=2).build_algo()
    try:
        results = algo_.evaluate()
        _check_evaluation(results, "episodes", 2)
    finally:
        algo_.stop()


def test_rllib_sample_on_the_training_runner_returns_episodes(ray_session):
    algo = _config("FastPPO").build_algo()
    try:
        algo.train()
        episodes = algo.env_runner.sample(num_episodes=2, explore=False)
        assert len(episodes) >= 2 and all(e.is_done for e in episodes)
        assert algo.train()["env_runners"]["num_env_steps_sampled"] > 0  # columnar training goes on afterwards
    finally:
        algo.stop()
