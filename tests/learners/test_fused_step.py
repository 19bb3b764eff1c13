"""The fused optimizer step (rl_speed.learners.optimizer_step): clipping equals RLlib's global-norm clipping; a
non-finite update is skipped and counted."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.torch_utils import clip_gradients

from rl_speed.algorithms.fast_dqn import FastDQNConfig
from rl_speed.learners.optimizer_step import NON_FINITE_SKIPPED


@pytest.fixture
def learner():
    config = FastDQNConfig().environment("CartPole-v1").training(grad_clip=0.5).debugging(seed=0)
    return config.build_learner(env=gym.make("CartPole-v1"))  # build_learner() also builds it


def _batch(n=64, reward=1.0):
    rng = np.random.default_rng(0)
    return {"obs": rng.normal(size=(n, 4)).astype(np.float32), "new_obs": rng.normal(size=(n, 4)).astype(np.float32),
            "actions": rng.integers(0, 2, n), "rewards": np.full(n, reward, np.float32),
            "terminateds": np.zeros(n, bool), "n_step": np.ones(n, np.float32), "weights": np.ones(n, np.float32)}


def _grads(learner, batch):
    tensors = {k: torch.as_tensor(v) for k, v in batch.items()}
    fwd = learner.module.forward_train({DEFAULT_MODULE_ID: tensors})
    losses = learner.compute_losses(fwd_out=fwd, batch={DEFAULT_MODULE_ID: tensors})
    return learner.compute_gradients(losses)


def test_clipping_matches_rllib_global_norm_clipping(learner):
    grads = _grads(learner, _batch(reward=50.0))  # large targets: the norm exceeds grad_clip
    reference = {k: g.clone() for k, g in grads.items()}
    clip_gradients(reference, grad_clip=0.5, grad_clip_by="global_norm")
    ours = learner.postprocess_gradients(grads)
    assert torch.linalg.vector_norm(torch.stack([g.norm() for g in ours.values()])) == pytest.approx(0.5, rel=1e-4)
    for key in reference:
        torch.testing.assert_close(ours[key], reference[key])


def test_non_finite_update_is_skipped_and_counted(learner):
    before = {k: p.detach().clone() for k, p in learner.module[DEFAULT_MODULE_ID].named_parameters()}
    results = learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(_batch(reward=np.nan))}, 64),
                             timesteps={"num_env_steps_sampled_lifetime": 0})
    after = dict(learner.module[DEFAULT_MODULE_ID].named_parameters())
    for key, value in before.items():
        torch.testing.assert_close(after[key].detach(), value)
    assert results[NON_FINITE_SKIPPED].peek() == 1
    learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(_batch())}, 64),
                   timesteps={"num_env_steps_sampled_lifetime": 0})
    changed = dict(learner.module[DEFAULT_MODULE_ID].named_parameters())
    assert any(not torch.equal(changed[k].detach(), v) for k, v in before.items())  # a finite update does step


@pytest.mark.parametrize("double_q, loss_fn", [(True, "huber"), (False, "huber"), (True, "mse")])
def test_dqn_loss_equals_rllibs_dqn_torch_learner(double_q, loss_fn):
    from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner

    config = (FastDQNConfig().environment("CartPole-v1").training(double_q=double_q, td_error_loss_fn=loss_fn)
              .debugging(seed=0))
    lrn = config.build_learner(env=gym.make("CartPole-v1"))
    batch = {k: torch.as_tensor(v) for k, v in _batch(reward=3.0).items()}
    batch["terminateds"][::3] = True
    batch["n_step"][::2] = 3.0
    batch["weights"] = torch.linspace(0.1, 1.0, 64)
    fwd = lrn.module[DEFAULT_MODULE_ID].forward_train(batch)
    ours = lrn.compute_loss_for_module(module_id=DEFAULT_MODULE_ID, config=config, batch=batch, fwd_out=fwd)
    stock = DQNTorchLearner.compute_loss_for_module(lrn, module_id=DEFAULT_MODULE_ID, config=config, batch=batch,
                                                    fwd_out=fwd)
    torch.testing.assert_close(ours, stock)
    assert ours > 0


def test_lean_multi_minibatch_update_equals_sequential_rllib_updates():
    def fresh():
        config = FastDQNConfig().environment("CartPole-v1").debugging(seed=0)
        return config.build_learner(env=gym.make("CartPole-v1"))

    lean, stock = fresh(), fresh()
    for (k, a), b in zip(lean.module[DEFAULT_MODULE_ID].state_dict().items(),
                         stock.module[DEFAULT_MODULE_ID].state_dict().values()):
        assert torch.equal(a, b), k  # same start
    data = _batch(n=128, reward=2.0)
    ts = {"num_env_steps_sampled_lifetime": 0}
    results = lean.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(data)}, 64), minibatch_size=64,
                          num_epochs=1, timesteps=ts)
    for half in (slice(0, 64), slice(64, 128)):  # RLlib's path, one minibatch per call
        stock.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch({k: v[half] for k, v in data.items()})},
                                           64), timesteps=ts)
    for (k, a), b in zip(lean.module[DEFAULT_MODULE_ID].state_dict().items(),
                         stock.module[DEFAULT_MODULE_ID].state_dict().values()):
        torch.testing.assert_close(a, b, msg=k)
    assert results[DEFAULT_MODULE_ID]["num_module_steps_trained_lifetime"].peek() == 128
    assert sum(len(td) for td in results[DEFAULT_MODULE_ID]["td_error"].peek()) == 128  # one series per minibatch


def test_fused_adam_skips_a_non_finite_update_on_the_device_and_counts_it_once_per_call(learner):
    # The CUDA path (fused Adam with a found_inf tensor, count read once per update call), driven on CPU where
    # torch also has a fused Adam.
    module = learner.module[DEFAULT_MODULE_ID]
    params = list(learner._optimizer_parameters[learner.get_optimizer()])
    fused = torch.optim.Adam(params, lr=1e-3, fused=True)
    learner._named_optimizers = {k: fused for k in learner._named_optimizers}
    learner._optimizer_parameters = {fused: params}
    learner._module_optimizers = {DEFAULT_MODULE_ID: list(learner._named_optimizers)}
    learner._update_finite = []
    before = {k: p.detach().clone() for k, p in module.named_parameters()}
    results = learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(_batch(reward=np.nan))}, 64),
                             timesteps={"num_env_steps_sampled_lifetime": 0})
    for key, value in before.items():
        torch.testing.assert_close(dict(module.named_parameters())[key].detach(), value)
    assert results[NON_FINITE_SKIPPED].peek() == 1
    assert all(float(fused.state[p]["step"]) == 0 for p in params if p in fused.state)  # the skip undid the count
    learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(_batch())}, 64),
                   timesteps={"num_env_steps_sampled_lifetime": 0})
    assert any(not torch.equal(p.detach(), before[k]) for k, p in module.named_parameters())
    assert all(float(fused.state[p]["step"]) == 1 for p in params)
