"""Runners with ``num_gpus_per_env_runner`` > 0: RLlib puts a remote runner's module on a GPU, and the columnar path
must act there (observations moved to the module's device, outputs back as numpy, recurrent states kept on it).

Built in this process with ``worker_index=1`` (a local runner, index 0, never gets a GPU in RLlib), in the test
session's Ray: RLlib finds a runner's GPU through Ray's runtime context, which would otherwise start a default Ray here
and break the session fixture's start. Needs CUDA; CI's machines have none, so these run on a GPU box
(`pytest tests/env_runners/test_runner_device.py`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rl_speed
from rl_speed.columns import check

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on a GPU box)")


def _runner(recurrent: bool = False, gpus: float = 0.5):
    rl_speed.register()
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rl_speed.algorithms.fast_ppo import FastPPOConfig
    from rl_speed.env_runners import BatchedEnvRunner
    from rl_speed.registry import resolve_module

    snake = {"height": 5, "width": 5, "observation": "flat"}
    config = (FastPPOConfig().environment("rl_speed/Snake-v0", env_config=snake)
              .env_runners(env_runner_cls=BatchedEnvRunner, num_envs_per_env_runner=8, rollout_fragment_length=16,
                           gym_env_vectorize_mode="vector_entry_point", num_gpus_per_env_runner=gpus))
    if recurrent:
        config = config.training(bptt_horizon=8).rl_module(
            rl_module_spec=RLModuleSpec(module_class=resolve_module("recurrent")), model_config={"lstm_cell_size": 32})
    return BatchedEnvRunner(config=config, worker_index=1)


@needs_cuda
@pytest.mark.parametrize("recurrent", [False, True])
def test_a_gpu_runner_acts_on_its_gpu_and_returns_numpy_columns(ray_session, recurrent):
    runner = _runner(recurrent)
    assert next(runner.module.parameters()).device.type == "cuda"
    for _ in range(2):  # the second call continues the episodes (and the recurrent states) of the first
        cols = runner.sample_columns()
        check(cols)
        assert isinstance(cols["action_logp"], np.ndarray) and np.isfinite(cols["action_logp"]).all()
    if recurrent:
        import tree

        assert all(isinstance(s, np.ndarray) for s in tree.flatten(cols["state_in"]))
        assert all(isinstance(s, np.ndarray) for s in tree.flatten(cols["state_out"]))


def test_a_cpu_runner_keeps_its_module_on_the_cpu():
    runner = _runner(gpus=0)
    assert next(runner.module.parameters()).device.type == "cpu"
    check(runner.sample_columns())


@needs_cuda
def test_a_gpu_multi_agent_runner_acts_on_its_gpu_and_returns_numpy_columns(ray_session):
    """One forward per module per step on the GPU, over that module's lanes."""
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

    from rl_speed.algorithms.fast_ppo import FastPPOConfig
    from rl_speed.env_runners.multi_agent import MultiAgentBatchedEnvRunner

    config = (FastPPOConfig().environment(MultiAgentCartPole, env_config={"num_agents": 2})
              .env_runners(num_envs_per_env_runner=4, rollout_fragment_length=16, num_gpus_per_env_runner=0.5)
              .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=lambda aid, episode, **kw: f"p{aid}"))
    runner = MultiAgentBatchedEnvRunner(config=config, worker_index=1)
    try:
        assert all(next(runner.module[mid].parameters()).device.type == "cuda" for mid in ("p0", "p1"))
        for _ in range(2):
            cols = runner.sample_columns()
            check(cols)
            assert isinstance(cols["action_logp"], np.ndarray) and np.isfinite(cols["action_logp"][cols["valid"]]).all()
        assert {0, 1} <= set(np.unique(cols["module"]).tolist())  # both modules acted
    finally:
        runner.stop()
