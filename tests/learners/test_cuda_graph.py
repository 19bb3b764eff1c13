"""cuda_graph: the replayed whole-step graph trains exactly like the eager step (weights, BatchNorm statistics, target
network, Adam state, replay priorities, logged statistics), counts skipped non-finite steps, composes with bf16,
accumulation and compile, and bad settings fail at configuration time."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import TD_ERROR_KEY

from rl_speed.algorithms.fast_dqn import FastDQNConfig
from rl_speed.algorithms.fast_ppo import FastPPOConfig
from rl_speed.learners.optimizer_step import NON_FINITE_SKIPPED

FRAMES = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
ACTIONS = gym.spaces.Discrete(7)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA learner")


@pytest.mark.parametrize("config_cls, training, learners, needle", [
    (FastDQNConfig, {"cuda_graph": "yes"}, {}, "must be true or false"),
    (FastDQNConfig, {"cuda_graph": True}, {}, "needs a CUDA learner"),
    (FastDQNConfig, {"cuda_graph": True, "mixed_precision": "fp16"}, {"num_gpus_per_learner": 1}, "bf16"),
    (FastDQNConfig, {"cuda_graph": True, "lr": [[0, 1e-3], [1000, 1e-4]]}, {"num_gpus_per_learner": 1},
     "learning rate must be a constant"),
    (FastDQNConfig, {"cuda_graph": True}, {"num_gpus_per_learner": 1, "num_learners": 2}, "num_learners"),
])
def test_bad_cuda_graph_settings_fail_at_validation(config_cls, training, learners, needle):
    config = config_cls().environment("CartPole-v1").training(**training).learners(**learners)
    with pytest.raises(ValueError, match="cuda_graph") as error:
        config.validate()
    assert needle in str(error.value)


def test_cuda_graph_refuses_compile_modes_that_capture_graphs_themselves():
    config = (FastDQNConfig().environment("CartPole-v1").training(cuda_graph=True).learners(num_gpus_per_learner=1)
              .framework(torch_compile_learner=True, torch_compile_learner_dynamo_mode="reduce-overhead"))
    with pytest.raises(ValueError, match="captures CUDA graphs itself"):
        config.validate()


def _learner(**training):
    config = (FastDQNConfig()
              .environment(observation_space=FRAMES, action_space=ACTIONS)
              .training(train_batch_size=64, dueling=True, double_q=True, lr=1e-3, grad_clip=10.0,
                        target_network_update_freq=0, **training)
              .rl_module(model_config={"encoder": "nature"})
              .learners(num_gpus_per_learner=1)
              .debugging(seed=0))
    return config.build_learner()


def _batch(n, seed, reward_scale=1.0):
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (n, *FRAMES.shape), dtype=np.uint8)
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch({
        "obs": torch.as_tensor(frames, device="cuda"),
        "new_obs": torch.as_tensor(np.roll(frames, 1, axis=0), device="cuda"),
        "actions": torch.as_tensor(rng.integers(0, 7, n), device="cuda"),
        "rewards": (rng.normal(size=n) * reward_scale).astype(np.float32), "terminateds": rng.random(n) < 0.1,
        "n_step": np.full(n, 3.0, np.float32), "weights": rng.uniform(0.2, 1.0, n).astype(np.float32)})}, n)


def _train(learner, calls, minibatch=32, reward_scale=None):
    """`calls` update() calls of two minibatches each; returns each call's TD errors (the replay priorities)."""
    td_errors = []
    for i in range(calls):
        scale = reward_scale(i) if reward_scale else 1.0
        results = learner.update(batch=_batch(2 * minibatch, seed=i, reward_scale=scale), minibatch_size=minibatch,
                                 timesteps={"num_env_steps_sampled_lifetime": 1000 * (i + 1)})
        td_errors.append(np.concatenate([np.asarray(torch.as_tensor(t).cpu())
                                         for t in results[DEFAULT_MODULE_ID][TD_ERROR_KEY].peek()]))
    return td_errors, results


@cuda
def test_replayed_graph_trains_like_the_eager_step(ray_session, monkeypatch):  # (a GPU learner asks Ray for GPUs)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)  # the same conv algorithms in both learners
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    eager, graphed = _learner(), _learner(cuda_graph=True)
    graphed.module[DEFAULT_MODULE_ID].load_state_dict(eager.module[DEFAULT_MODULE_ID].state_dict())
    initial = {k: v.clone() for k, v in graphed.module[DEFAULT_MODULE_ID].state_dict().items()}
    eager_td, eager_results = _train(eager, 6)
    graphed_td, graphed_results = _train(graphed, 6)
    assert graphed._step_graphs.replays == 12 - 3  # 3 eager warm-up steps, then every minibatch replayed
    for a, b in zip(eager_td, graphed_td):
        assert len(b) == 64  # one priority per row of both minibatches
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-4)
    for key in ("qf_loss", "qf_mean", "td_error_mean"):
        assert graphed_results[DEFAULT_MODULE_ID][key].peek() == pytest.approx(
            eager_results[DEFAULT_MODULE_ID][key].peek(), rel=1e-3, abs=1e-4)
    ours = graphed.module[DEFAULT_MODULE_ID].state_dict()  # weights, BatchNorm statistics and the target network
    for name, value in eager.module[DEFAULT_MODULE_ID].state_dict().items():
        torch.testing.assert_close(ours[name], value, rtol=1e-3, atol=1e-4, msg=name)
    tracked = [v.item() for k, v in ours.items() if k.endswith("num_batches_tracked") and "target" not in k]
    assert tracked and min(tracked) >= 12  # BatchNorm saw every minibatch, replays included (equal to eager above)
    targets = [k for k in ours if "target" in k and ours[k].is_floating_point()]
    assert targets and any(not torch.equal(ours[k], initial[k]) for k in targets)  # synced in place

@cuda
def test_a_replayed_non_finite_step_is_skipped_and_counted(ray_session):
    learner = _learner(cuda_graph=True)
    _train(learner, 3)  # warm-up and capture
    before = {k: v.detach().clone() for k, v in learner.module[DEFAULT_MODULE_ID].named_parameters()}
    _, results = _train(learner, 1, reward_scale=lambda i: float("nan"))
    assert results[NON_FINITE_SKIPPED].peek() == 2  # both replayed minibatches skipped
    for name, p in learner.module[DEFAULT_MODULE_ID].named_parameters():
        torch.testing.assert_close(p, before[name], msg=name)
    _, results = _train(learner, 1)
    assert results[NON_FINITE_SKIPPED].peek() == 0  # finite again: nothing skipped in this call
    assert any(not torch.equal(p, before[k]) for k, p in learner.module[DEFAULT_MODULE_ID].named_parameters())


@cuda
@pytest.mark.parametrize("training, compile", [({"mixed_precision": "bf16", "grad_accumulation_steps": 2}, False),
                                               ({"mixed_precision": "bf16"}, True)])
def test_graph_composes_with_bf16_accumulation_and_compile(ray_session, training, compile):
    config_learner = _learner(cuda_graph=True, **training)
    if compile:
        config = config_learner.config.copy(copy_frozen=False).framework(
            torch_compile_learner=True, torch_compile_learner_what_to_compile="forward_train")
        config_learner = config.build_learner()
    # detached: a clone with a grad_fn would hold the parameters' autograd nodes across the capture and break it
    before = {k: v.detach().clone() for k, v in config_learner.module[DEFAULT_MODULE_ID].named_parameters()}
    _, results = _train(config_learner, 5, minibatch=64 if training.get("grad_accumulation_steps") else 32)
    assert config_learner._step_graphs.replays > 0
    assert np.isfinite(results[DEFAULT_MODULE_ID]["qf_loss"].peek())
    assert any(not torch.equal(p, before[k]) for k, p in config_learner.module[DEFAULT_MODULE_ID].named_parameters())


def test_fast_ppo_refuses_cuda_graph_with_the_reason():
    config = (FastPPOConfig().environment("CartPole-v1").training(cuda_graph=True)
              .learners(num_gpus_per_learner=1))
    with pytest.raises(ValueError, match="FastDQN only"):
        config.validate()
