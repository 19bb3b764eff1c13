"""Core pinning: the core map of this host, and a real FastPPO algorithm's learner and runner processes pinned apart."""

from __future__ import annotations

import os

import pytest

from benchmarks.scaling.core_pinning import physical_cores, pin_cores, split_cores


def test_physical_cores_cover_this_process_cpus_once():
    cores = physical_cores()
    assert sorted(cpu for core in cores for cpu in core) == sorted(os.sched_getaffinity(0))
    assert cores == sorted(cores)


def _algo(num_learners: int):
    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    return (FastPPOConfig().environment("CartPole-v1")
            .env_runners(num_env_runners=1, num_envs_per_env_runner=4, rollout_fragment_length=16)
            .rl_module(model_config={"fcnet_hiddens": [8], "head_fcnet_hiddens": []})
            .training(train_batch_size_per_learner=64, minibatch_size=32, num_epochs=1)
            .learners(num_learners=num_learners, num_cpus_per_learner=1)).build_algo()


@pytest.mark.skipif(len(physical_cores()) < 2, reason="needs two physical cores: one for the learner, one for runners")
def test_the_learner_gets_a_core_of_its_own_and_the_runner_the_rest(ray_session):
    algo = _algo(num_learners=1)
    try:
        cores = physical_cores()
        placed = pin_cores(algo)
        rest = sorted(cpu for core in cores[1:] for cpu in core)
        assert placed == {"learners": [cores[0]], "runners": rest}
        # Read back from the processes themselves, every thread of them (inline: a test module's function does not
        # unpickle in a Ray worker).
        threads = lambda _actor: {tuple(sorted(os.sched_getaffinity(int(tid))))  # noqa: E731
                                  for tid in os.listdir("/proc/self/task")}
        (learner_threads,) = [r.get() for r in algo.learner_group.foreach_learner(threads)]
        assert learner_threads == {tuple(cores[0])}
        (runner_threads,) = algo.env_runner_group.foreach_env_runner(threads, local_env_runner=False)
        assert runner_threads == {tuple(rest)}
        algo.train()  # pinned processes still train
    finally:
        algo.stop()


def test_a_learner_in_the_driver_is_refused(ray_session):
    algo = _algo(num_learners=0)
    try:
        with pytest.raises(ValueError, match="driver's process"):
            pin_cores(algo)
    finally:
        algo.stop()


def test_split_cores_gives_each_learner_a_core_and_refuses_a_host_with_none_left_for_the_runners():
    cores = physical_cores()
    own, rest = split_cores(len(cores) - 1)
    assert own == cores[:-1] and rest == sorted(cores[-1])
    with pytest.raises(ValueError, match=rf"needs a physical core per learner \({len(cores)}\) and one more"):
        split_cores(len(cores))
