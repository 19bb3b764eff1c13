"""The forward-free env runner of `preset_variants --forward-free`: uniform actions and their log-probabilities in
the columns the forward would have written, and no forward."""

from __future__ import annotations

import math

import numpy as np

import rl_speed
from benchmarks.race.forward_free import ForwardFreeEnvRunner
from rl_speed import columns as C


def _runner(seed: int = 3) -> ForwardFreeEnvRunner:
    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    rl_speed.register()
    config = (FastPPOConfig().environment("CartPole-v1")
              .env_runners(env_runner_cls=ForwardFreeEnvRunner, num_envs_per_env_runner=8, rollout_fragment_length=16)
              .debugging(seed=seed))
    return ForwardFreeEnvRunner(config=config, worker_index=1, num_workers=1)


def test_it_acts_uniformly_and_writes_the_uniform_policys_columns_without_a_forward(monkeypatch):
    runner = _runner()

    def no_forward(*args, **kwargs):
        raise AssertionError("the module's forward ran")

    for name in ("forward_exploration", "forward_inference", "_forward_exploration", "_forward_inference", "forward"):
        monkeypatch.setattr(runner.module, name, no_forward, raising=False)
    columns = runner.sample_columns()
    actions = columns[C.ACTIONS]
    assert actions.shape == (16, 8) and set(np.unique(actions)) == {0, 1}
    np.testing.assert_allclose(columns[C.ACTION_LOGP], -math.log(2))
    assert columns[C.ACTION_DIST_INPUTS].shape == (16, 8, 2) and not columns[C.ACTION_DIST_INPUTS].any()


def test_its_draws_repeat_under_the_same_seed():
    first, second = _runner(seed=7), _runner(seed=7)
    np.testing.assert_array_equal(first.sample_columns()[C.ACTIONS], second.sample_columns()[C.ACTIONS])
