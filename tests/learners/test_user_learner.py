"""A user's RLlib Learner subclass on the columnar path (rl_speed.learners.user_learner): RLlib's own learner examples
(a custom loss term, separate policy and value optimizers) run on FastPPO stacked on its columnar learner, local and
as a learner actor, from a class or a dotted path; a DQN learner subclass on FastDQN; a class of the wrong family is
refused at config time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.examples.learners.classes.custom_ppo_loss_fn_learner import PPOTorchLearnerWithWeightRegularizerLoss
from ray.rllib.examples.learners.classes.separate_vf_lr_and_optimizer_learner import (
    PPOTorchLearnerWithSeparateVfOptimizer,
)
from ray.rllib.utils.annotations import override

from rl_speed.learners.ppo import FastPPOTorchLearner
from rl_speed.learners.user_learner import stack_on_columns

REGULARIZER = "ray.rllib.examples.learners.classes.custom_ppo_loss_fn_learner.PPOTorchLearnerWithWeightRegularizerLoss"


def _regularizer_config(cls, learner_class=PPOTorchLearnerWithWeightRegularizerLoss, **learners):
    # examples/learners/ppo_with_custom_loss_fn.py's settings, at a small batch
    return (cls().environment("CartPole-v1")
            .env_runners(num_env_runners=0, num_envs_per_env_runner=4)
            .training(learner_class=learner_class, learner_config_dict={"regularizer_coeff": 0.02}, num_epochs=6,
                      vf_loss_coeff=0.01, lr=0.0003, train_batch_size_per_learner=256, minibatch_size=128)
            .rl_module(model_config=DefaultModelConfig(vf_share_layers=True))
            .learners(**learners)
            .debugging(seed=0))


def _train(config, iterations=2):
    algo = config.build_algo()
    try:
        for _ in range(iterations):
            result = algo.train()
        return algo, result
    finally:
        algo.stop()


@pytest.mark.parametrize("learner_class", [PPOTorchLearnerWithWeightRegularizerLoss, REGULARIZER])
def test_a_custom_loss_learner_runs_on_columns_and_logs_as_on_stock(ray_session, learner_class):
    from ray.rllib.algorithms.ppo import PPOConfig

    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    fast = _regularizer_config(FastPPOConfig, learner_class)
    learner = fast.learner_class
    assert issubclass(learner, PPOTorchLearnerWithWeightRegularizerLoss) and issubclass(learner, FastPPOTorchLearner)
    assert learner.__mro__[1:3] == (PPOTorchLearnerWithWeightRegularizerLoss, FastPPOTorchLearner)
    # (Stock PPO takes only a class: a dotted path, as a YAML file gives it, is an rl_speed convenience.)
    for cls in (PPOConfig, FastPPOConfig) if isinstance(learner_class, type) else (FastPPOConfig,):
        _, result = _train(_regularizer_config(cls, learner_class))
        assert np.isfinite(result["learners"]["default_policy"]["mean_weight"]), cls.__name__  # the user's metric


def test_a_custom_loss_learner_runs_as_a_learner_actor(ray_session):
    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    _, result = _train(_regularizer_config(FastPPOConfig, num_learners=1, num_cpus_per_learner=0.5))
    assert np.isfinite(result["learners"]["default_policy"]["mean_weight"])


def test_separate_policy_and_value_optimizers_each_train_their_networks(ray_session):
    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    config = (FastPPOConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=4)
              .training(learner_class=PPOTorchLearnerWithSeparateVfOptimizer, learner_config_dict={"lr_vf": 0.0005},
                        num_epochs=6, vf_loss_coeff=1.0, lr=0.001, train_batch_size_per_learner=256,
                        minibatch_size=128)
              .rl_module(model_config=DefaultModelConfig(vf_share_layers=False)).debugging(seed=0))
    algo = config.build_algo()
    try:
        learner = algo.learner_group._learner
        names = sorted(learner._named_optimizers)
        assert names == ["default_policy_optim_for_pi", "default_policy_optim_for_vf"], names
        lrs = {name: opt.param_groups[0]["lr"] for name, opt in learner._named_optimizers.items()}
        assert lrs == {"default_policy_optim_for_pi": 0.001, "default_policy_optim_for_vf": 0.0005}
        module = learner.module["default_policy"]
        before = {part: [p.detach().clone() for p in getattr(module, part).parameters()] for part in ("pi", "vf")}
        algo.train()
        for part, old in before.items():
            assert any(not torch.equal(a, b) for a, b in zip(old, getattr(module, part).parameters())), part
    finally:
        algo.stop()


class DQNLossWithExtraMetric(DQNTorchLearner):
    @override(DQNTorchLearner)
    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        loss = super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
        self.metrics.log_value((module_id, "user_loss_seen"), loss.detach(), window=1)
        return loss


def test_a_dqn_learner_subclass_runs_on_fast_dqn(ray_session):
    from rl_speed.algorithms.fast_dqn import FastDQNConfig

    config = (FastDQNConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=8)
              .training(learner_class=DQNLossWithExtraMetric, num_steps_sampled_before_learning_starts=64,
                        train_batch_size=32)
              .debugging(seed=0))
    _, result = _train(config, iterations=4)
    assert np.isfinite(result["learners"]["default_policy"]["user_loss_seen"])


def test_a_learner_of_another_family_is_refused_at_config_time():
    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    config = FastPPOConfig().environment("CartPole-v1").training(learner_class=DQNLossWithExtraMetric)
    with pytest.raises(ValueError, match="DQNLossWithExtraMetric.*does not extend RLlib's PPOTorchLearner"):
        config.validate()


def test_stacking_is_one_class_per_pair_and_leaves_columnar_subclasses_alone():
    class Mine(FastPPOTorchLearner):
        pass

    assert stack_on_columns(Mine, FastPPOTorchLearner) is Mine
    first = stack_on_columns(PPOTorchLearnerWithWeightRegularizerLoss, FastPPOTorchLearner)
    assert first is stack_on_columns(PPOTorchLearnerWithWeightRegularizerLoss, FastPPOTorchLearner)


@pytest.mark.slow
def test_separate_vf_optimizer_example_reaches_its_stop_reward(ray_session):
    """examples/learners/separate_vf_lr_and_optimizer.py's configuration as the script runs it (2 env runners, PPO's
    default batch of 4,000) reaches its stop reward, 450."""
    import time

    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    config = (FastPPOConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5)
              .training(learner_class=PPOTorchLearnerWithSeparateVfOptimizer, learner_config_dict={"lr_vf": 0.0005},
                        num_epochs=6, vf_loss_coeff=1.0, lr=0.001)
              .rl_module(model_config=DefaultModelConfig(vf_share_layers=False)))
    algo = config.build_algo()
    best, start = -np.inf, time.monotonic()
    try:
        while best < 450.0 and time.monotonic() - start < 600:
            best = max(best, algo.train()["env_runners"]["episode_return_mean"])
    finally:
        algo.stop()
    assert best >= 450.0, f"best episode_return_mean {best:.1f} after 600 s"
