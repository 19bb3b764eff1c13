"""Fault tolerance: with `restart_failed_env_runners`, killing an env runner process (by its PID) mid-run does not
stop FastPPO; the run goes on, RLlib restarts the runner and the result reports the restart. An exception raised in a
runner while it samples stops the run, naming the runner and the error, unless `ignore_env_runner_failures` is set."""

from __future__ import annotations

import os
import signal
import sys
import time

import gymnasium as gym
import pytest
import ray

import rl_speed

rl_speed.register()

from rl_speed.algorithms.fast_ppo import FastPPOConfig  # noqa: E402
from rl_speed.algorithms.sampling import EnvRunnerSamplingError  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # remote runners build the env below


class BrokenOnRunnerTwo(gym.Wrapper):
    """CartPole whose copies on env runner 2 raise after 40 steps (an env bug that shows on one runner only)."""

    def __init__(self, config):
        super().__init__(gym.make("CartPole-v1"))
        self.broken = getattr(config, "worker_index", 0) == 2
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.broken and self.steps > 40:
            raise RuntimeError("the simulator lost its state")
        return self.env.step(action)


def _broken_config():
    return (FastPPOConfig().environment(BrokenOnRunnerTwo)
            .env_runners(num_env_runners=2, num_envs_per_env_runner=2, rollout_fragment_length=32,
                         num_cpus_per_env_runner=0.5)
            .training(train_batch_size_per_learner=128, minibatch_size=64, num_epochs=1))


def test_an_error_in_a_runner_while_sampling_stops_the_run_naming_it(ray_session):
    algo = _broken_config().build_algo()
    try:
        with pytest.raises(EnvRunnerSamplingError, match=r"(?s)env runner 2 raised while sampling: RuntimeError: the "
                                                         r"simulator lost its state.*ignore_env_runner_failures"):
            for _ in range(3):
                algo.train()
    finally:
        algo.stop()


def test_with_ignore_env_runner_failures_the_error_is_counted_and_the_run_goes_on(ray_session):
    algo = _broken_config().fault_tolerance(ignore_env_runner_failures=True).build_algo()
    try:
        results = [algo.train() for _ in range(3)]
        assert results[-1]["sampler"]["runner_errors_lifetime"] >= 1
        assert results[-1]["env_runners"]["num_env_steps_sampled_lifetime"] > 0
    finally:
        algo.stop()


@pytest.mark.slow
def test_killed_env_runner_is_restarted_and_training_goes_on(ray_session):
    config = (FastPPOConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=2, num_envs_per_env_runner=8, rollout_fragment_length=32)
              .fault_tolerance(restart_failed_env_runners=True)
              .training(train_batch_size_per_learner=512, minibatch_size=128, num_epochs=1))
    algo = config.build_algo()
    try:
        algo.train()
        pids = algo.env_runner_group.foreach_env_runner(lambda runner: os.getpid(), local_env_runner=False)
        assert len(pids) == 2 and os.getpid() not in pids
        os.kill(pids[0], signal.SIGKILL)
        time.sleep(1.0)
        results = [algo.train() for _ in range(6)]
        final = results[-1]
        assert final["fault_tolerance"]["num_remote_worker_restarts"] >= 1
        assert final["fault_tolerance"]["num_healthy_workers"] == 2
        new_pids = algo.env_runner_group.foreach_env_runner(lambda runner: os.getpid(), local_env_runner=False)
        assert pids[0] not in new_pids and len(new_pids) == 2
        steps = [r["env_runners"]["num_env_steps_sampled_lifetime"] for r in results]
        assert steps == sorted(steps) and steps[-1] > steps[0]  # sampling went on
    finally:
        algo.stop()
