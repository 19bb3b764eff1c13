"""ppo_loss: RLlib's PPO loss, term for term (value, gradients, every logged statistic against RLlib's own method on
the same batch), without the boolean indexing that makes a GPU learner wait for its device six times a minibatch."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rl_speed.algorithms.fast_ppo import FastPPOConfig
from rl_speed.learners.ppo_loss import masked_mean_fn, ppo_loss


def _learner(env: str, **training):
    config = FastPPOConfig().environment(env).training(**training).debugging(seed=0)
    return config, config.build_learner(env=gym.make(env))


def _batch(env: str, n: int = 64, masked: bool = True, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    space = gym.make(env).action_space
    space.seed(seed)
    obs_space = gym.make(env).observation_space
    actions = np.stack([space.sample() for _ in range(n)])
    dist_inputs = rng.normal(size=(n, 2 if isinstance(space, gym.spaces.Discrete) else 2 * space.shape[0]))
    batch = {Columns.OBS: rng.uniform(-1, 1, size=(n, *obs_space.shape)).astype(np.float32),
             Columns.ACTIONS: actions, Columns.ACTION_LOGP: rng.normal(-0.7, 0.3, n).astype(np.float32),
             Columns.ACTION_DIST_INPUTS: dist_inputs.astype(np.float32),
             Postprocessing.ADVANTAGES: rng.normal(size=n).astype(np.float32),
             Postprocessing.VALUE_TARGETS: rng.normal(size=n).astype(np.float32)}
    if masked:
        batch[Columns.LOSS_MASK] = rng.random(n) < 0.7
    return {k: torch.as_tensor(v) for k, v in batch.items()}


def _loss_and_stats(fn, learner, config, batch):
    learner.metrics = MetricsLogger()
    module = learner.module[DEFAULT_MODULE_ID]
    module.zero_grad(set_to_none=True)
    loss = fn(learner, DEFAULT_MODULE_ID, config, batch, module.forward_train(batch))
    loss.backward()
    grads = {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}
    return loss.detach(), grads, learner.metrics.peek().get(DEFAULT_MODULE_ID, {})


def _rllib(learner, module_id, config, batch, fwd_out):
    return PPOTorchLearner.compute_loss_for_module(learner, module_id=module_id, config=config, batch=batch,
                                                   fwd_out=fwd_out)


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("training", [{}, {"use_kl_loss": False}, {"use_critic": False, "use_gae": False}],
                         ids=["defaults", "no-kl", "no-critic"])
@pytest.mark.parametrize("masked", [True, False], ids=["mask", "no-mask"])
def test_loss_gradients_and_statistics_equal_rllibs(env, training, masked):
    config, learner = _learner(env, **training)
    batch = _batch(env, masked=masked)
    ours, our_grads, our_stats = _loss_and_stats(ppo_loss, learner, config, batch)
    theirs, their_grads, their_stats = _loss_and_stats(_rllib, learner, config, batch)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert our_grads.keys() == their_grads.keys() and our_grads
    for name, grad in their_grads.items():
        torch.testing.assert_close(our_grads[name], grad, rtol=1e-4, atol=1e-6)
    assert our_stats.keys() == their_stats.keys()
    for key, value in their_stats.items():
        ours_value, theirs_value = (float(torch.as_tensor(v).detach()) for v in (our_stats[key], value))
        assert ours_value == pytest.approx(theirs_value, rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("training", [{}, {"use_critic": False, "use_gae": False}], ids=["defaults", "no-critic"])
def test_statistics_are_logged_for_an_updates_last_minibatch_only(env, training):
    config, learner = _learner(env, **training)
    batch = _batch(env)
    last_loss, last_grads, stats = _loss_and_stats(ppo_loss, learner, config, batch)
    assert stats  # is_last_minibatch defaults to True: outside the update loop every call logs, as RLlib's
    learner.is_last_minibatch = False  # what UpdateLoopMixin sets for every minibatch but an update's last
    try:
        loss, grads, stats = _loss_and_stats(ppo_loss, learner, config, batch)
        assert stats == {} and learner.metrics.peek() == {}
    finally:
        learner.is_last_minibatch = True
    assert torch.equal(loss, last_loss) and grads.keys() == last_grads.keys()
    assert all(torch.equal(grads[name], grad) for name, grad in last_grads.items())


def test_masked_mean_selects_leading_axes_as_indexing_does():
    mask = torch.tensor([[True, False, True], [False, True, True]])
    x = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    torch.testing.assert_close(masked_mean_fn({Columns.LOSS_MASK: mask})(x), torch.sum(x[mask]) / mask.sum())
    masked_inf = torch.where(mask[..., None], x, torch.inf)  # values outside the mask stay out, as with indexing
    torch.testing.assert_close(masked_mean_fn({Columns.LOSS_MASK: mask})(masked_inf), torch.sum(x[mask]) / mask.sum())


def test_the_loss_and_its_backward_run_no_op_that_waits_for_the_device(syncing_ops):
    config, learner = _learner("CartPole-v1")
    batch = _batch("CartPole-v1")
    module = learner.module[DEFAULT_MODULE_ID]
    with syncing_ops() as ops:
        ppo_loss(learner, DEFAULT_MODULE_ID, config, batch, module.forward_train(batch)).backward()
    assert ops.seen == []
    with syncing_ops() as ops:  # the probe sees RLlib's boolean indexing: it would catch ours
        _rllib(learner, DEFAULT_MODULE_ID, config, batch, module.forward_train(batch)).backward()
    assert len(ops.seen) >= 5


@pytest.mark.parametrize("choice, syncs", [(None, False), ("sync_free", False), ("rllib", True)])
def test_learner_config_dict_picks_the_loss(choice, syncs, syncing_ops):
    extra = {} if choice is None else {"learner_config_dict": {"ppo_loss": choice}}
    config = FastPPOConfig().environment("CartPole-v1").learners(**extra).debugging(seed=0)
    learner = config.build_learner(env=gym.make("CartPole-v1"))
    batch = _batch("CartPole-v1")
    module = learner.module[DEFAULT_MODULE_ID]
    with syncing_ops() as ops:
        learner.compute_loss_for_module(module_id=DEFAULT_MODULE_ID, config=config, batch=batch,
                                        fwd_out=module.forward_train(batch)).backward()
    assert bool(ops.seen) == syncs


def test_an_unknown_loss_choice_is_refused_at_config_time():
    config = FastPPOConfig().environment("CartPole-v1").learners(learner_config_dict={"ppo_loss": "fast"})
    with pytest.raises(ValueError, match=r"`learner_config_dict\['ppo_loss'\]`='fast' must be one of 'sync_free', "
                                         r"'rllib'"):
        config.validate()
