"""The durotaxis graph workload through RLlib: FastPPO's columns carry the hybrid Dict actions and their log-probs
exactly, the env receives actions inside its bounds, a remote runner trains, and stock PPO runs the same module."""

from __future__ import annotations

import numpy as np
import torch
import tree

import rl_speed

rl_speed.register()

from ray.rllib.algorithms.ppo import PPOConfig  # noqa: E402
from ray.rllib.core import DEFAULT_MODULE_ID  # noqa: E402
from ray.rllib.core.columns import Columns as RLlibColumns  # noqa: E402
from ray.rllib.core.rl_module.rl_module import RLModuleSpec  # noqa: E402

from rl_speed.algorithms.fast_ppo import FastPPOConfig  # noqa: E402
from rl_speed.modules.graph import GraphActorCritic  # noqa: E402
from rl_speed.modules.hybrid_distribution import HybridGraphDistribution  # noqa: E402

ENV = "rl_speed/Durotaxis-v0"
ENV_CONFIG = {"max_nodes": 12, "max_steps": 20}
MODULE = RLModuleSpec(module_class=GraphActorCritic, model_config={"hidden": 16, "num_layers": 1})


def _config(config_class=FastPPOConfig, envs: int = 8, **env_runners):
    return (config_class()
            .environment(ENV, env_config=ENV_CONFIG)
            .env_runners(num_env_runners=0, num_envs_per_env_runner=envs, rollout_fragment_length=16,
                         **env_runners)
            .training(train_batch_size_per_learner=16 * envs, minibatch_size=32, num_epochs=1, lr=1e-3)
            .rl_module(rl_module_spec=MODULE)
            .debugging(seed=0))


def test_columns_carry_dict_actions_and_their_log_probs(ray_session):
    algo = _config(gym_env_vectorize_mode="vector_entry_point").build_algo()
    try:
        columns = algo.env_runner.sample_columns()
        actions = columns["actions"]
        assert set(actions) == {"spawn", "spawn_params", "delete_ratio"}
        assert actions["spawn"].shape == (16, 8, 12) and actions["spawn"].dtype == np.int8
        assert actions["spawn_params"].shape == (16, 8, 12, 2) and actions["delete_ratio"].shape == (16, 8, 1)
        assert columns["action_dist_inputs"].shape == (16, 8, 12 * 6 + 2)
        # The learner rebuilds the acting distribution and scores the stored actions: same log-probs.
        module = algo.learner_group._learner.module[DEFAULT_MODULE_ID]
        obs = tree.map_structure(lambda o: torch.from_numpy(o[:-1].reshape(-1, *o.shape[2:])), columns["obs"])
        with torch.no_grad():
            inputs = module._forward({RLlibColumns.OBS: obs})[RLlibColumns.ACTION_DIST_INPUTS]
            logp = HybridGraphDistribution(inputs).logp(
                tree.map_structure(lambda a: torch.from_numpy(a.reshape(-1, *a.shape[2:])), actions))
        np.testing.assert_allclose(logp.numpy(), columns["action_logp"].reshape(-1), rtol=1e-4, atol=1e-3)
        # No spawn request from an empty slot.
        assert (actions["spawn"][columns["obs"]["node_mask"][:-1] == 0] == 0).all()
        # The env gets delete ratios unsquashed from the module's [-1, 1] scale into [0, 1], and clipped.
        sent = algo.env_runner._env_actions({
            "spawn": np.zeros((3, 12), np.int8), "spawn_params": np.full((3, 12, 2), 4.0, np.float32),
            "delete_ratio": np.array([[-1.0], [0.0], [3.0]], np.float32)})
        np.testing.assert_allclose(sent["delete_ratio"][:, 0], [0.0, 0.5, 1.0])
        assert (sent["spawn_params"] == 1.0).all()
    finally:
        algo.stop()


def test_fastppo_trains_the_graph_module_with_a_remote_runner(ray_session):
    algo = _config(gym_env_vectorize_mode="vector_entry_point").env_runners(num_env_runners=1).build_algo()
    try:
        before = {k: v.clone() for k, v in algo.learner_group._learner.module[DEFAULT_MODULE_ID].state_dict().items()}
        for _ in range(2):
            result = algo.train()
        after = algo.learner_group._learner.module[DEFAULT_MODULE_ID].state_dict()
        assert all(not torch.equal(before[k], after[k]) for k in before)  # every head and the log-stds moved
        learner = result["learners"][DEFAULT_MODULE_ID]
        assert np.isfinite([learner["policy_loss"], learner["vf_loss"], learner["entropy"]]).all()
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] > 0.8 * 2 * 128
    finally:
        algo.stop()


def test_stock_ppo_runs_the_same_module(ray_session):
    algo = _config(PPOConfig, envs=4, gym_env_vectorize_mode="sync").build_algo()
    try:
        result = algo.train()
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] >= 64
        assert np.isfinite(result["learners"][DEFAULT_MODULE_ID]["policy_loss"])
    finally:
        algo.stop()
