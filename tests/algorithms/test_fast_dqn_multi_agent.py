"""FastDQN on multi-agent envs: one replay buffer per module holding only that module's transitions, every module
trained from its own buffer, policies_to_train, checkpoints with every buffer, remote runners; the slow test learns
RLlib's MultiAgentCartPole with a policy per agent."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

from rl_speed.algorithms.fast_dqn import FastDQNConfig


def cartpole_config(num_agents=2, **runners):
    return (FastDQNConfig()
            .environment(MultiAgentCartPole, env_config={"num_agents": num_agents})
            .env_runners(**{"num_env_runners": 0, "num_envs_per_env_runner": 4, "rollout_fragment_length": 16,
                            **runners})
            .multi_agent(policies={f"p{i}" for i in range(num_agents)},
                         policy_mapping_fn=lambda aid, episode, **kw: f"p{aid}")
            .training(train_batch_size_per_learner=32, training_intensity=4, n_step=3,
                      num_steps_sampled_before_learning_starts=64,
                      replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": 4096})
            .rl_module(model_config={"fcnet_hiddens": [16], "head_fcnet_hiddens": []})
            .reporting(min_sample_timesteps_per_iteration=256)
            .debugging(seed=0))


def weights(algo, module_id):
    return [p.detach().clone() for p in algo.learner_group._learner.module[module_id].parameters()]


def test_one_buffer_per_module_each_trains_its_module(ray_session):
    algo = cartpole_config().build_algo()
    try:
        before = {m: weights(algo, m) for m in ("p0", "p1")}
        result = algo.train()
        buffers = algo.replay_buffers
        assert set(buffers) == {"p0", "p1"}
        sampled = result["env_runners"]["num_module_steps_sampled_lifetime"]
        for module_id, buffer in buffers.items():
            # each buffer holds exactly its module's agent steps (nothing of the other agent's lanes)
            assert len(buffer) == sampled[module_id] > 0
            assert any(not torch.equal(a, b) for a, b in zip(before[module_id], weights(algo, module_id)))
            assert "qf_loss" in result["learners"][module_id]
            assert result["replay_buffer"][module_id]["size"] == len(buffer)
        lanes = algo.replay_buffers["p0"]._step_id >= 0  # [C, L]: agent 0 has the even lanes, agent 1 the odd ones
        assert lanes[:, 0::2].any() and not lanes[:, 1::2].any()
    finally:
        algo.stop()


def test_policies_to_train_and_checkpoints_keep_every_buffer(ray_session, tmp_path):
    algo = cartpole_config().multi_agent(policies_to_train=["p0"]).build_algo()
    try:
        frozen = weights(algo, "p1")
        result = algo.train()
        assert all(torch.equal(a, b) for a, b in zip(frozen, weights(algo, "p1")))
        assert "qf_loss" not in result["learners"].get("p1", {}) and "qf_loss" in result["learners"]["p0"]
        sizes = {m: len(b) for m, b in algo.replay_buffers.items()}
        path = algo.save_to_path(str(tmp_path / "ckpt"))
    finally:
        algo.stop()
    from ray.rllib.algorithms.algorithm import Algorithm

    restored = Algorithm.from_checkpoint(path)
    try:
        assert {m: len(b) for m, b in restored.replay_buffers.items()} == sizes
        restored.train()
    finally:
        restored.stop()


def test_remote_runners_fill_their_lane_ranges(ray_session):
    algo = cartpole_config(num_env_runners=2, num_cpus_per_env_runner=0.5, num_envs_per_env_runner=2).build_algo()
    try:
        algo.train()
        steps = algo.replay_buffers["p1"]._lane_steps  # 2 runners x 2 copies x 2 agents = 8 lanes
        assert len(steps) == 8 and (steps[1::2] > 0).all()
    finally:
        algo.stop()


def test_a_multi_agent_config_has_no_single_replay_buffer(ray_session):
    algo = cartpole_config().build_algo()
    try:
        with pytest.raises(AttributeError, match="one replay buffer per module"):
            algo.replay_buffer  # noqa: B018
    finally:
        algo.stop()


@pytest.mark.slow
def test_learns_multi_agent_cartpole_with_a_policy_per_agent(ray_session):
    # tuned_examples/cartpole_fastdqn.yaml's settings, two agents with a policy each; the summed return of both.
    config = (FastDQNConfig()
              .environment(MultiAgentCartPole, env_config={"num_agents": 2})
              .env_runners(num_env_runners=0, num_envs_per_env_runner=8, rollout_fragment_length=16)
              .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=lambda aid, episode, **kw: f"p{aid}")
              .training(train_batch_size_per_learner=64, training_intensity=8, n_step=3, lr=0.0005, gamma=0.99,
                        dueling=False, target_network_update_freq=500, num_steps_sampled_before_learning_starts=1000,
                        epsilon=[[0, 1.0], [10000, 0.02]],
                        replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": 50000,
                                              "alpha": 0.6, "beta": 0.4})
              .reporting(min_sample_timesteps_per_iteration=1000)
              .rl_module(model_config={"fcnet_hiddens": [64, 64], "fcnet_activation": "relu",
                                       "head_fcnet_hiddens": []})
              .debugging(seed=0))
    algo = config.build_algo()
    try:
        best = -np.inf
        for _ in range(200):
            result = algo.train()
            best = max(best, result["env_runners"].get("episode_return_mean", -np.inf))
            if best >= 600 or result["time_total_s"] > 240:
                break
        print(f"FastDQN MultiAgentCartPole: summed return {best:.0f} after {result['time_total_s']:.0f} s, "
              f"{result['env_runners']['num_env_steps_sampled_lifetime']} env steps")
        assert best >= 600
    finally:
        algo.stop()
