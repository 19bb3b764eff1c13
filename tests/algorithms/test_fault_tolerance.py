"""Fault tolerance: with `restart_failed_env_runners`, killing an env runner process (by its PID) mid-run does not
stop FastPPO; the run goes on, RLlib restarts the runner and the result reports the restart."""

from __future__ import annotations

import os
import signal
import time

import pytest

import rl_speed

rl_speed.register()

from rl_speed.algorithms.fast_ppo import FastPPOConfig  # noqa: E402


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
