"""QNetModule's `nature` encoder: BatchNorm CNN with He init and no conv bias, uint8 frames cast inside, BatchNorm
statistics in eval mode for acting and train mode for learning, and what the env runners receive."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from ray.rllib.core.columns import Columns

from rl_speed.modules.q_net import QNetModule

FRAMES = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)


def _module(inference_only=False, **cfg):
    torch.manual_seed(0)
    module = QNetModule(observation_space=FRAMES, action_space=gym.spaces.Discrete(7), inference_only=inference_only,
                        model_config={"encoder": "nature", "dueling": True, "double_q": True, **cfg})
    if not inference_only:
        module.make_target_networks()
    return module


def _frames(n, seed=0):
    return torch.as_tensor(np.random.default_rng(seed).integers(0, 256, (n, 84, 84, 4), dtype=np.uint8))


def test_architecture_batchnorm_no_conv_bias_inplace_relu_dueling():
    q = _module().q
    convs = [m for m in q.encoder if isinstance(m, nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [(32, (8, 8), (4, 4)), (64, (4, 4), (2, 2)),
                                                                          (64, (3, 3), (1, 1))]
    assert all(c.bias is None for c in convs)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in q.encoder) == 3
    assert all(m.inplace for m in q.encoder if isinstance(m, nn.ReLU))
    assert [m.out_features for m in q.encoder if isinstance(m, nn.Linear)] == [512]
    assert q.value is not None and q.advantage.out_features == 7
    no_bn = _module(batch_norm=False).q
    assert not any(isinstance(m, nn.BatchNorm2d) for m in no_bn.encoder)
    assert all(c.bias is not None for c in no_bn.encoder if isinstance(c, nn.Conv2d))


def test_he_init():
    for m in _module().q.encoder:
        if isinstance(m, nn.Conv2d):
            fan_out = m.out_channels * m.kernel_size[0] * m.kernel_size[1]
            assert m.weight.std().item() == pytest.approx((2.0 / fan_out) ** 0.5, rel=0.15)
        if isinstance(m, nn.Linear):
            assert m.weight.std().item() == pytest.approx((2.0 / m.in_features) ** 0.5, rel=0.15)


def test_uint8_frames_are_cast_and_scaled_inside_the_module():
    module = _module().eval()
    frames = _frames(8)
    with torch.no_grad():
        q_uint8 = module.q(frames)
        scaled = frames.float() / 255.0
        x = module.q.encoder(scaled.permute(0, 3, 1, 2))
        adv, value = module.q.advantage(x), module.q.value(x)
    torch.testing.assert_close(q_uint8, value + adv - adv.mean(1, keepdim=True))
    assert q_uint8.dtype == torch.float32


def test_acting_uses_running_statistics_and_never_changes_them():
    module = _module()
    module.eval()  # what BatchedEnvRunner does once, at build
    stats = {k: v.clone() for k, v in module.state_dict().items() if "running" in k}
    frames = _frames(16)
    with torch.inference_mode():
        alone = module._forward_inference({Columns.OBS: frames[:1]})
        module._forward_exploration({Columns.OBS: frames}, t=0)
        q_alone, q_batch = module.q(frames[:1]), module.q(frames)[:1]
    torch.testing.assert_close(q_alone, q_batch)  # a frame's Q-values do not depend on the rest of the batch
    assert alone[Columns.ACTIONS].shape == (1,)
    for k, v in module.state_dict().items():
        if "running" in k:
            torch.testing.assert_close(v, stats[k])


def test_training_uses_batch_statistics_and_updates_running_statistics():
    module = _module()
    mean_before = module.q.encoder[1].running_mean.clone()
    target_before = module._target_q.encoder[1].running_mean.clone()
    frames = _frames(16)
    out = module.forward_train({Columns.OBS: frames, Columns.NEXT_OBS: _frames(16, seed=1)})
    assert module.training and module._target_q.training  # online and target both normalize by batch statistics
    assert not torch.equal(module.q.encoder[1].running_mean, mean_before)
    assert not torch.equal(module._target_q.encoder[1].running_mean, target_before)
    with torch.no_grad():
        q_batch = module.q(frames)[:1]
        q_alone = module.q(frames[:2])[:1]
    assert not torch.allclose(q_batch, q_alone)  # train mode: depends on the batch
    loss = (out["qf_preds"] ** 2).sum()  # (a plain sum over actions would cancel the dueling advantages)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.q.parameters())


def test_env_runners_receive_the_running_statistics_not_the_target():
    learner_side = _module()
    learner_side.forward_train({Columns.OBS: _frames(32), Columns.NEXT_OBS: _frames(32, seed=1)})
    state = learner_side.get_state(inference_only=True)
    assert any(k.endswith("running_mean") for k in state) and not any("_target_q" in k for k in state)
    runner_side = _module(inference_only=True)
    runner_side.set_state(state)
    runner_side.eval()
    learner_side.eval()
    frames = _frames(4, seed=2)
    with torch.inference_mode():
        torch.testing.assert_close(runner_side.q(frames), learner_side.q(frames))


@pytest.mark.parametrize("space, needle", [
    (gym.spaces.Box(-1, 1, (8,), np.float32), "needs image observations"),
    (gym.spaces.Box(0, 255, (20, 20, 4), np.uint8), "at least 36 x 36"),
])
def test_bad_observation_spaces_are_named(space, needle):
    with pytest.raises(ValueError, match=needle):
        QNetModule(observation_space=space, action_space=gym.spaces.Discrete(3), model_config={"encoder": "nature"})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_uint8_frames_go_to_the_gpu_as_uint8():
    module = _module().cuda().eval()
    frames = _frames(8).cuda()
    with torch.inference_mode():
        q = module.q(frames)
    assert q.device.type == "cuda" and q.dtype == torch.float32
