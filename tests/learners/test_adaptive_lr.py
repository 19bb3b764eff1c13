"""FastPPO's ``lr_kl_target`` (rl_speed.learners.adaptive_lr): the rule, the learner following it minibatch by
minibatch (RLlib's schedule no longer writes the starting lr back), the lr in checkpoints, and the config-time
refusals."""

from __future__ import annotations

import math

import pytest
import torch

import rl_speed

rl_speed.register()

from ray.rllib.core import DEFAULT_MODULE_ID  # noqa: E402

from rl_speed.algorithms.fast_ppo import FastPPOConfig  # noqa: E402
from rl_speed.learners.adaptive_lr import FACTOR, MAX_LR, MIN_LR, adapt_lr_  # noqa: E402
from rl_speed.learners.ppo import FastPPOTorchLearner  # noqa: E402

START_LR = 1e-3


def _rule(lr: float, kl: float, target: float) -> float:
    """The rule in plain Python, the reference for the tensor version."""
    if kl > 2 * target:
        return max(lr / FACTOR, MIN_LR)
    if kl < target / 2:
        return min(lr * FACTOR, MAX_LR)
    return lr


@pytest.mark.parametrize("kl, expected", [
    (0.05, 1e-3 / FACTOR),  # above twice the target: lowered
    (0.001, 1e-3 * FACTOR),  # below half the target: raised
    (0.01, 1e-3),  # near the target: kept
    (0.02, 1e-3),  # exactly twice: kept
    (float("nan"), 1e-3),  # a non-finite KL: kept
])
def test_rule_moves_the_lr_tensor_in_place(kl, expected):
    lr = torch.tensor(1e-3)
    adapt_lr_(lr, torch.tensor(kl), target=0.01)
    assert lr.item() == pytest.approx(expected, rel=1e-6)


def test_rule_keeps_the_lr_within_its_bounds():
    high, low = torch.tensor(MAX_LR), torch.tensor(MIN_LR)
    adapt_lr_(high, torch.tensor(0.0), target=0.01)
    adapt_lr_(low, torch.tensor(1.0), target=0.01)
    assert high.item() == pytest.approx(MAX_LR) and low.item() == pytest.approx(MIN_LR)


def _config(**training) -> FastPPOConfig:
    return (FastPPOConfig()
            .environment("CartPole-v1")
            .env_runners(num_env_runners=0, num_envs_per_env_runner=8, rollout_fragment_length=32)
            .rl_module(model_config={"fcnet_hiddens": [16], "head_fcnet_hiddens": []})
            .training(**{"train_batch_size_per_learner": 256, "minibatch_size": 64, "num_epochs": 2,
                         "lr": START_LR, "lr_kl_target": 0.002, **training})
            .debugging(seed=1))


def _update(algo, columns, lifetime):
    steps = {"num_env_steps_sampled_lifetime": lifetime, "num_agent_steps_sampled_lifetime": lifetime}
    (results,) = algo.learner_group.update(batch=[columns], minibatch_size=64, num_epochs=2,
                                           shuffle_batch_per_epoch=True, timesteps=steps)
    return results


def _lr(learner) -> float:
    (optimizer,) = learner._optimizer_parameters
    return float(optimizer.param_groups[0]["lr"])


def test_learner_moves_the_lr_by_each_minibatch_kl_across_update_calls(ray_session, monkeypatch):
    algo = _config().build_algo()
    try:
        learner = algo.learner_group._learner
        kls = []
        measure = learner._policy_kl
        monkeypatch.setattr(learner, "_policy_kl", lambda *a: kls.append(measure(*a)) or kls[-1])
        expected = START_LR
        for call in range(3):
            kls.clear()
            results = _update(algo, algo.env_runner.sample_columns(), lifetime=256 * (call + 1))
            assert len(kls) == 8  # 2 epochs x 4 minibatches of 64, one KL each
            for kl in kls:
                expected = _rule(expected, kl.item(), 0.002)
            assert _lr(learner) == pytest.approx(expected, rel=1e-5), call
            # RLlib logs the lr the rule left (its constant schedule no longer writes the starting lr back)
            assert float(results[DEFAULT_MODULE_ID]["default_optimizer_learning_rate"].peek()) == pytest.approx(expected,
                                                                                                     rel=1e-5)
        assert not math.isclose(expected, START_LR)  # the rule really moved it
        assert kls[0].item() < kls[-1].item()  # the first minibatch's policy is the behaviour policy: KL ~ 0
    finally:
        algo.stop()


def test_moved_lr_survives_a_checkpoint(ray_session, tmp_path):
    algo = _config().build_algo()
    try:
        _update(algo, algo.env_runner.sample_columns(), lifetime=256)
        moved = _lr(algo.learner_group._learner)
        assert not math.isclose(moved, START_LR)
        path = algo.save_to_path(str(tmp_path / "ckpt"))
    finally:
        algo.stop()
    restored = _config().build_algo()
    try:
        restored.restore_from_path(path)
        learner = restored.learner_group._learner
        assert _lr(learner) == pytest.approx(moved, rel=1e-6)
        (optimizer,) = learner._optimizer_parameters
        assert optimizer.param_groups[0]["lr"] is optimizer.device_lr  # the tensor the rule moves is the one read
    finally:
        restored.stop()


class _LossWithoutSuper(FastPPOTorchLearner):
    """A user's learner whose loss never reaches FastPPO's compute_loss_for_module."""

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        return self._ppo_loss(module_id, config, batch, fwd_out)


def test_a_loss_that_skips_fastppo_measuring_the_kl_stops_with_the_key_named(ray_session):
    algo = _config().training(learner_class=_LossWithoutSuper).build_algo()
    try:
        with pytest.raises(Exception, match="lr_kl_target"):
            _update(algo, algo.env_runner.sample_columns(), lifetime=256)
    finally:
        algo.stop()


@pytest.mark.parametrize("change, message", [
    (lambda c: c.training(lr_kl_target=0), "`lr_kl_target`=0 must be a number > 0"),
    (lambda c: c.training(lr_kl_target="0.01"), "`lr_kl_target`='0.01' must be a number > 0"),
    (lambda c: c.training(lr=[[0, 1e-3], [1000, 1e-4]]), "`lr` must be one number, not the schedule"),
    (lambda c: c.learners(num_learners=2), "`lr_kl_target` with num_learners=2"),
])
def test_settings_it_cannot_honour_fail_at_validation(change, message):
    with pytest.raises(ValueError) as info:
        change(_config()).validate()
    assert message in str(info.value)


def test_without_the_key_the_lr_stays_a_number_and_follows_rllib_schedules(ray_session):
    algo = _config(lr_kl_target=None, lr=[[0, 1e-3], [512, 1e-4]]).build_algo()
    try:
        _update(algo, algo.env_runner.sample_columns(), lifetime=256)
        learner = algo.learner_group._learner
        (optimizer,) = learner._optimizer_parameters
        assert not isinstance(optimizer.param_groups[0]["lr"], torch.Tensor)
        assert _lr(learner) == pytest.approx(5.5e-4)
    finally:
        algo.stop()
