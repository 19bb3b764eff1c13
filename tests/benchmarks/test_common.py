"""bench.common's helpers: a timed training run (its hooks included) on a real algorithm, interleaved rounds, the
median run, and a GPU preset turned into a CPU config."""

from __future__ import annotations

import pytest

from benchmarks.common import (build_with_every_runner, gpu_keys_off, interleaved, learner_seconds, median_run,
                               rate_range, timed_run, train_rate)


def _cartpole():
    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    return (FastPPOConfig().environment("CartPole-v1")
            .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=16)
            .rl_module(model_config={"fcnet_hiddens": [8], "head_fcnet_hiddens": []})
            .training(train_batch_size_per_learner=64, minibatch_size=64, num_epochs=1))


def test_train_rate_counts_the_steps_after_the_warm_up(ray_session):
    rate, result = train_rate(_cartpole(), iterations=2, warmup=1)
    assert rate > 0 and result["training_iteration"] == 3  # the rate is read after the warm-up iteration


def test_timed_run_calls_its_hooks_once_each_around_the_timed_iterations(ray_session):
    calls = []

    def before(algo):
        calls.append(("before", algo.iteration))
        return "prepared"

    def after(algo):
        calls.append(("after", algo.iteration))
        return "profiled"

    run = timed_run(_cartpole(), seconds=0.5, warmup=1, before=before, after=after)
    assert run["before"] == "prepared" and run["after"] == "profiled" and run["rate"] > 0
    assert calls == [("before", 0), ("after", 1 + run["iterations"])]


def test_rounds_interleave_the_plan():
    assert interleaved([(1, "own"), (2, "own")], 3) == [(1, "own"), (2, "own")] * 3
    assert interleaved(["a"], 0) == []


def test_the_median_run_is_the_lower_middle_one_by_rate():
    runs = [{"rate": r, "id": i} for i, r in enumerate((5.0, 1.0, 3.0, 4.0))]
    assert median_run(runs)["id"] == 2  # rates 1, 3, 4, 5: the lower middle one
    assert median_run(runs[:3])["id"] == 2  # 1, 3, 5
    assert rate_range(runs) == " (1-5, 4 runs)" and rate_range(runs[:1]) == ""


def test_the_mettagrid_bench_refuses_repeats_below_one_before_ray_starts():
    from benchmarks.throughput.mettagrid import run

    with pytest.raises(ValueError, match="`repeats` must be >= 1, got 0"):
        run(0)


def test_a_gpu_preset_with_its_gpu_keys_off_validates_for_cpu_learners():
    """The grid GPU preset (torch.compile, `cuda_graph`) on CPU learners: refused as it is, valid after the helper."""
    from pathlib import Path

    from rl_speed.experiments import load_experiments

    (experiment,) = load_experiments(Path(__file__).parents[2] / "tuned_examples" / "grid_ppo_gpu.yaml")
    config = experiment.config.copy(copy_frozen=False)
    with pytest.raises(ValueError, match="cuda_graph"):
        config.copy(copy_frozen=False).learners(num_gpus_per_learner=0).validate()
    gpu_keys_off(config).validate()
    assert (config.num_gpus_per_learner, config.torch_compile_learner, config.cuda_graph) == (0, False, False)


def test_a_run_whose_env_runner_failed_to_start_is_refused_not_trained_with_fewer_runners(ray_session):
    from ray.tune.registry import register_env

    def _second_runner_cannot_make_its_env(env_config):  # local: pickled by value, so the workers need no tests/
        import gymnasium as gym

        if getattr(env_config, "worker_index", 0) == 2:  # the driver probes the env with a plain dict
            raise RuntimeError("this runner's env cannot start")
        return gym.make("CartPole-v1")

    register_env("second_runner_fails", _second_runner_cannot_make_its_env)
    config = (_cartpole().environment("second_runner_fails")
              .env_runners(num_env_runners=2, num_envs_per_env_runner=2, num_cpus_per_env_runner=0.5))
    with pytest.raises(RuntimeError, match="1 of the 2 env runners configured started"):
        build_with_every_runner(config)
    config = config.environment("CartPole-v1")
    build_with_every_runner(config).stop()  # every runner started: built


def test_the_learner_time_sums_the_phases_each_algorithm_reports():
    ppo = {"profiles": [{"sample_s": 0.1, "advantages_s": 0.02, "learn_s": 0.3},
                        {"sample_s": 0.1, "advantages_s": 0.04, "learn_s": 0.5}]}
    dqn = {"profiles": [{"sample_s": 0.01, "replay_s": 0.2, "learn_s": 1.1}]}  # FastDQN reports no advantages
    assert learner_seconds(ppo) == pytest.approx(0.03 + 0.4)
    assert learner_seconds(dqn) == pytest.approx(1.3)
    assert learner_seconds({"profiles": [{"sample_s": 0.1}]}) != learner_seconds({"profiles": [{"sample_s": 0.1}]})
