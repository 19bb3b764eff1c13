"""FastPPO on multi-agent envs: RLlib's MultiAgentCartPole with one policy per agent and with a shared one, local and
remote runners, async sampling, policies_to_train, PettingZoo ParallelEnvs through RLlib's wrapper, and the grid
arena's MultiAgentEnv form; the slow test is RLlib's own tuned example (multi_agent_cartpole_ppo.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole
from ray.tune.registry import register_env

from rl_speed.algorithms.fast_ppo import FastPPOConfig


def cartpole_config(num_agents=2, shared=False, **runners):
    policies = {"shared"} if shared else {f"p{i}" for i in range(num_agents)}
    mapping = (lambda aid, episode, **kw: "shared") if shared else (lambda aid, episode, **kw: f"p{aid}")
    return (FastPPOConfig()
            .environment(MultiAgentCartPole, env_config={"num_agents": num_agents})
            .env_runners(**{"num_env_runners": 0, "num_envs_per_env_runner": 4, **runners})
            .multi_agent(policies=policies, policy_mapping_fn=mapping)
            .training(train_batch_size_per_learner=512, minibatch_size=128, num_epochs=2)
            .rl_module(model_config={"fcnet_hiddens": [16]}))


def weights(algo, module_id):
    return [p.detach().clone() for p in algo.learner_group._learner.module[module_id].parameters()]


@pytest.mark.parametrize("shared", [False, True])
def test_trains_every_module_and_reports_multi_agent_keys(ray_session, shared):
    algo = cartpole_config(shared=shared).build_algo()
    try:
        modules = ["shared"] if shared else ["p0", "p1"]
        before = {mid: weights(algo, mid) for mid in modules}
        result = algo.train()
        for mid in modules:
            assert any(not torch.equal(a, b) for a, b in zip(before[mid], weights(algo, mid))), mid
            assert mid in result["learners"] and "policy_loss" in result["learners"][mid]
        runners = result["env_runners"]
        assert set(runners["num_agent_steps_sampled"]) == {"0", "1"}
        assert set(runners["num_module_steps_sampled"]) == set(modules)
        # an env step moves both agents (while both are up): agent steps >= env steps
        assert sum(runners["num_agent_steps_sampled"].values()) >= runners["num_env_steps_sampled"]
        assert runners["num_env_steps_sampled_lifetime"] >= 512 // 2
        # RLlib's meaning: env steps trained count env steps (once per epoch, 2 epochs), not agent steps
        trained = result["learners"]["__all_modules__"]["num_env_steps_trained"]
        assert trained == runners["num_env_steps_sampled"] * 2
        assert result["learners"]["__all_modules__"]["num_module_steps_trained"] > trained
    finally:
        algo.stop()


def test_policies_to_train(ray_session):
    algo = cartpole_config().multi_agent(policies_to_train=["p0"]).build_algo()
    try:
        frozen = weights(algo, "p1")
        result = algo.train()
        assert all(torch.equal(a, b) for a, b in zip(frozen, weights(algo, "p1")))
        assert "policy_loss" not in result["learners"].get("p1", {}) and "policy_loss" in result["learners"]["p0"]
    finally:
        algo.stop()


def test_remote_runners_async_sampling_and_evaluation(ray_session):
    config = (cartpole_config(num_env_runners=2, num_envs_per_env_runner=2)
              .training(async_sampling=True, train_batch_size_per_learner=256, minibatch_size=128)
              .evaluation(evaluation_interval=2, evaluation_duration=2, evaluation_num_env_runners=0))
    algo = config.build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] > 0
        assert np.isfinite(result["evaluation"]["env_runners"]["episode_return_mean"])
    finally:
        algo.stop()


def test_pettingzoo_parallel_env_through_rllibs_wrapper(ray_session):
    pettingzoo = pytest.importorskip("pettingzoo", reason="PettingZoo is the optional extra [pettingzoo]")
    import gymnasium as gym
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv

    class Ping(pettingzoo.ParallelEnv):
        """Two agents; reward 1 when an agent's action equals the step's parity; 8 steps per episode."""

        metadata = {"name": "ping_v0"}

        def __init__(self):
            self.possible_agents = ["left", "right"]
            self.t = 0

        def observation_space(self, agent):
            return gym.spaces.Box(0, 8, (1,), np.float32)

        def action_space(self, agent):
            return gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            self.agents, self.t = list(self.possible_agents), 0
            return {a: np.array([0.0], np.float32) for a in self.agents}, {a: {} for a in self.agents}

        def step(self, actions):
            self.t += 1
            obs = {a: np.array([self.t], np.float32) for a in self.agents}
            rewards = {a: float(actions[a] == self.t % 2) for a in self.agents}
            done = {a: False for a in self.agents}
            cut = {a: self.t >= 8 for a in self.agents}
            if self.t >= 8:
                self.agents = []
            return obs, rewards, done, cut, {a: {} for a in obs}

    register_env("rl_speed_test_ping", lambda cfg: ParallelPettingZooEnv(Ping()))
    config = (FastPPOConfig().environment("rl_speed_test_ping")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=4)
              .multi_agent(policies={"shared"}, policy_mapping_fn=lambda aid, episode, **kw: "shared")
              .training(train_batch_size_per_learner=256, minibatch_size=64, num_epochs=4, lr=3e-3)
              .rl_module(model_config={"fcnet_hiddens": [16]}))
    algo = config.build_algo()
    try:
        for _ in range(3):
            result = algo.train()
        assert result["env_runners"]["episode_len_mean"] == pytest.approx(8.0)
        assert np.isfinite(result["env_runners"]["episode_return_mean"])
    finally:
        algo.stop()


@pytest.mark.slow
def test_rllib_tuned_example_multi_agent_cartpole(ray_session):
    """RLlib's tuned_examples/ppo/multi_agent_cartpole_ppo.py with FastPPO for PPO: PPO's defaults (2 env runners,
    batch 4000, minibatch 128, 30 epochs, lr 5e-5) plus its `vf_loss_coeff=0.005` and `vf_share_layers`; 2 agents,
    2 policies; stop at a summed return of 800 (400 per agent) within 300k env steps."""
    config = (FastPPOConfig()
              .environment(MultiAgentCartPole, env_config={"num_agents": 2})
              .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=lambda aid, episode, **kw: f"p{aid}")
              .training(vf_loss_coeff=0.005)
              .rl_module(model_config={"vf_share_layers": True}))
    algo = config.build_algo()
    try:
        best, steps = -np.inf, 0
        while steps < 300_000 and best < 800:
            result = algo.train()
            steps = result["env_runners"]["num_env_steps_sampled_lifetime"]
            best = max(best, result["env_runners"].get("episode_return_mean", -np.inf))
        assert best >= 800, f"summed return {best:.0f} after {steps} env steps"
    finally:
        algo.stop()


def test_a_heuristic_module_acts_beside_a_learned_one(ray_session):
    """examples/multi_agent/custom_heuristic_policy.py's setup: RLlib's RandomRLModule (not a torch module) acts for
    one agent, a learned module for the other; only the learned one trains, and both agents' returns are reported."""
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole
    from ray.rllib.examples.rl_modules.classes.random_rlm import RandomRLModule

    config = (FastPPOConfig().environment(MultiAgentCartPole, env_config={"num_agents": 2})
              .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=32)
              .training(train_batch_size_per_learner=128, minibatch_size=64, num_epochs=1)
              .multi_agent(policies={"learnable_policy", "random"},
                           policy_mapping_fn=lambda agent_id, *args, **kwargs: ["learnable_policy",
                                                                                "random"][agent_id % 2],
                           policies_to_train=["learnable_policy"])
              .rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs={
                  "learnable_policy": RLModuleSpec(), "random": RLModuleSpec(module_class=RandomRLModule)})))
    algo = config.build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        assert "total_loss" in result["learners"]["learnable_policy"]
        assert "total_loss" not in result["learners"].get("random", {})  # (RLlib logs every module's entropy coeff)
        returns = result["env_runners"]["module_episode_returns_mean"]
        assert set(returns) == {"learnable_policy", "random"}
    finally:
        algo.stop()
