"""OptimizerStepMixin (rl_speed.learners.optimizer_step): gradient accumulation equals the big-batch step, mixed
precision stays close to fp32, an overflowed (scaled) step is skipped and counted, and bad keys fail at configuration
time."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from rl_speed.algorithms.fast_dqn import FastDQNConfig
from rl_speed.algorithms.fast_ppo import FastPPOConfig
from rl_speed.learners.optimizer_step import NON_FINITE_SKIPPED
from rl_speed.learners.optimizer_step import GRAD_SCALER_STATE_KEY, micro_batches

TIMESTEPS = {"num_env_steps_sampled_lifetime": 0}


def _learner(**training):
    config = (FastDQNConfig().environment("CartPole-v1").training(grad_clip=1e6, **training).debugging(seed=0))
    return config.build_learner(env=gym.make("CartPole-v1"))


def _batch(n=96, reward=1.0, seed=0):
    rng = np.random.default_rng(seed)
    return {"obs": rng.normal(size=(n, 4)).astype(np.float32), "new_obs": rng.normal(size=(n, 4)).astype(np.float32),
            "actions": rng.integers(0, 2, n), "rewards": rng.normal(reward, 1.0, n).astype(np.float32),
            "terminateds": rng.random(n) < 0.2, "n_step": np.ones(n, np.float32),
            "weights": rng.uniform(0.2, 1.0, n).astype(np.float32)}


def _update(learner, batch):
    n = len(batch["rewards"])
    return learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, n), minibatch_size=n,
                          timesteps=TIMESTEPS)


def _same_weights(src, dst):
    dst.module[DEFAULT_MODULE_ID].load_state_dict(src.module[DEFAULT_MODULE_ID].state_dict())


@pytest.mark.parametrize("k", [3, 4])
def test_accumulated_step_equals_one_big_batch_step_in_fp32(k):
    big, accumulated = _learner(), _learner(grad_accumulation_steps=k)
    _same_weights(big, accumulated)
    calls = []
    forward = accumulated.module[DEFAULT_MODULE_ID].forward_train
    accumulated.module[DEFAULT_MODULE_ID].forward_train = lambda b, **kw: calls.append(len(b["obs"])) or forward(b)
    batch = _batch()
    _update(big, batch)
    _update(accumulated, batch)
    assert len(calls) == k and sum(calls) == 96  # really k micro-batches
    ours = dict(accumulated.module[DEFAULT_MODULE_ID].named_parameters())
    for name, p in big.module[DEFAULT_MODULE_ID].named_parameters():
        torch.testing.assert_close(ours[name].grad, p.grad, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours[name].detach(), p.detach(), rtol=1e-5, atol=1e-6)


def test_micro_batches_split_rows_and_share_the_rest():
    batch = {"obs": torch.zeros(10, 3), "actions": {"a": torch.arange(10)}, "scale": torch.tensor(2.0)}
    parts = micro_batches(batch, 3)
    assert [len(p["obs"]) for _, p in parts] == [3, 3, 4]
    assert sum(share for share, _ in parts) == pytest.approx(1.0)
    assert torch.equal(torch.cat([p["actions"]["a"] for _, p in parts]), torch.arange(10))
    assert all(p["scale"] is batch["scale"] for _, p in parts)


def test_bf16_loss_is_within_tolerance_of_fp32():
    fp32, bf16 = _learner(), _learner(mixed_precision="bf16")
    _same_weights(fp32, bf16)
    batch = {k: torch.as_tensor(v) for k, v in _batch(n=256, reward=3.0).items()}
    _, loss32, _ = fp32._uncompiled_update({DEFAULT_MODULE_ID: batch})
    _, loss16, _ = bf16._uncompiled_update({DEFAULT_MODULE_ID: batch})
    assert loss16[DEFAULT_MODULE_ID].dtype == torch.float32
    assert loss16[DEFAULT_MODULE_ID].item() == pytest.approx(loss32[DEFAULT_MODULE_ID].item(), rel=2e-2)
    assert loss16[DEFAULT_MODULE_ID].item() != loss32[DEFAULT_MODULE_ID].item()  # autocast really ran in bf16


def test_scaled_step_that_overflows_is_skipped_counted_and_lowers_the_scale():
    # fp16 autocast needs CUDA (tests/learners/test_optimizer_step.py::test_fp16_on_cuda runs it there); the scaler
    # logic is device-independent, so drive it on CPU with a scale so large that the scaled gradients overflow
    # (MSE on targets of ~1e4 gives gradients far above 1; times 1e38 that exceeds fp32's 3.4e38).
    learner = _learner(td_error_loss_fn="mse")
    learner._scaler = torch.amp.GradScaler("cpu", init_scale=1e38)
    learner._autocast_dtype = torch.float32  # take the mixin's path (autocast at fp32 is a no-op cast)
    learner._autocast = lambda: torch.autocast("cpu", enabled=False)
    before = {k: p.detach().clone() for k, p in learner.module[DEFAULT_MODULE_ID].named_parameters()}
    results = _update(learner, _batch(reward=1e4))
    for name, p in learner.module[DEFAULT_MODULE_ID].named_parameters():
        torch.testing.assert_close(p.detach(), before[name])  # no step
    assert results[NON_FINITE_SKIPPED].peek() == 1
    assert learner._scaler.get_scale() == pytest.approx(0.5e38)
    learner._scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    _update(learner, _batch(reward=1e4))
    assert any(not torch.equal(p.detach(), before[n])
               for n, p in learner.module[DEFAULT_MODULE_ID].named_parameters())  # a finite scaled step does step


def test_grad_scaler_state_is_saved_and_restored_with_the_optimizer():
    learner = _learner(td_error_loss_fn="mse")
    learner._scaler = torch.amp.GradScaler("cpu", init_scale=1e38)  # as above: a scale that overflows
    learner._autocast_dtype = torch.float32
    learner._autocast = lambda: torch.autocast("cpu", enabled=False)
    _update(learner, _batch(reward=1e4))
    state = learner.get_state()
    assert state[GRAD_SCALER_STATE_KEY]["scale"] == pytest.approx(0.5e38)
    assert GRAD_SCALER_STATE_KEY not in learner.get_state(not_components="optimizer")
    restored = _learner(td_error_loss_fn="mse")
    restored._scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    restored.set_state(state)
    assert restored._scaler.get_scale() == pytest.approx(0.5e38)
    assert GRAD_SCALER_STATE_KEY not in _learner().get_state()  # no scaler (fp32, bf16): nothing extra


def test_a_restored_optimizer_takes_this_learners_capturable_setting():
    """A checkpoint of a captured step's learner (capturable Adam) resumes eagerly: the param groups follow this
    learner's `cuda_graph`, not the checkpoint's (the reverse, on a GPU: test_cuda_graph.py)."""
    source = _learner()
    _update(source, _batch())
    for optimizer in source._optimizer_parameters:
        for group in optimizer.param_groups:
            group["capturable"] = True  # as a `cuda_graph` learner's checkpoint has it
    restored = _learner()
    restored.set_state(source.get_state())
    assert not any(g["capturable"] for o in restored._optimizer_parameters for g in o.param_groups)
    _update(restored, _batch(seed=1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 autocast with a grad scaler needs CUDA")
def test_fp16_on_cuda_steps_close_to_fp32_and_skips_an_overflow(ray_session):  # (a GPU learner asks Ray for GPUs)
    config = (FastDQNConfig().environment("CartPole-v1").learners(num_gpus_per_learner=1)
              .training(grad_clip=1e6, mixed_precision="fp16", td_error_loss_fn="mse").debugging(seed=0))
    learner = config.build_learner(env=gym.make("CartPole-v1"))
    assert learner._device.type == "cuda"
    start = {k: p.detach().clone() for k, p in learner.module[DEFAULT_MODULE_ID].named_parameters()}
    for seed in range(5):  # the first steps may overflow at the initial scale 2**16: skipped, and the scale drops
        _update(learner, _batch(seed=seed))
    assert any(not torch.equal(p.detach(), start[n]) for n, p in learner.module[DEFAULT_MODULE_ID].named_parameters())
    assert all(torch.isfinite(p).all() for p in learner.module[DEFAULT_MODULE_ID].parameters())
    # MSE on targets of 1e4 times a scale near fp16's max (65,504): the fp16 backward overflows.
    learner._scaler = torch.amp.GradScaler("cuda", init_scale=6e4)
    before = {k: p.detach().clone() for k, p in learner.module[DEFAULT_MODULE_ID].named_parameters()}
    results = _update(learner, _batch(reward=1e4))
    assert results[NON_FINITE_SKIPPED].peek() >= 1
    for name, p in learner.module[DEFAULT_MODULE_ID].named_parameters():
        torch.testing.assert_close(p.detach(), before[name])
    assert learner._scaler.get_scale() < 6e4


@pytest.mark.parametrize("config_cls", [FastDQNConfig, FastPPOConfig])
@pytest.mark.parametrize("training, needle", [
    ({"mixed_precision": "fp8"}, "`mixed_precision`='fp8' is not one of off, bf16, fp16"),
    ({"mixed_precision": "fp16"}, "needs a CUDA learner"),
    ({"grad_accumulation_steps": 0}, "`grad_accumulation_steps`=0 must be an integer >= 1"),
    ({"grad_accumulation_steps": "4"}, "`grad_accumulation_steps`='4' must be an integer >= 1"),
])
def test_bad_train_step_keys_fail_at_validation(config_cls, training, needle):
    config = config_cls().environment("CartPole-v1").training(**training)
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        config.validate()


def test_fast_dqn_batch_must_split_into_equal_micro_batches():
    config = FastDQNConfig().environment("CartPole-v1").training(train_batch_size=96, grad_accumulation_steps=5)
    with pytest.raises(ValueError, match="96 does not split into 5 equal micro-batches"):
        config.validate()


def test_fast_ppo_trains_with_bf16_and_accumulation(ray_session):
    config = (FastPPOConfig().environment("CartPole-v1").env_runners(num_env_runners=0, num_envs_per_env_runner=8,
                                                                     rollout_fragment_length=32)
              .training(train_batch_size_per_learner=256, minibatch_size=128, num_epochs=1,
                        mixed_precision="bf16", grad_accumulation_steps=2).debugging(seed=0))
    algo = config.build_algo()
    try:
        before = {k: p.detach().clone() for k, p in algo.get_module().named_parameters()}
        result = algo.train()
        assert all(not torch.equal(before[k], p.detach()) for k, p in algo.get_module().named_parameters())
        assert np.isfinite(result["learners"][DEFAULT_MODULE_ID]["total_loss"])
    finally:
        algo.stop()
