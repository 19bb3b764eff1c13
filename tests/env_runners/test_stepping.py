"""The per-step helpers every runner shares (rl_speed.env_runners.stepping); the runners' own tests cover them in use."""

from __future__ import annotations

import numpy as np
import pytest

from rl_speed.env_runners.stepping import clip_rewards, write_step


def test_categorical_sampling_draws_what_rllibs_distribution_draws():
    """The runners' categorical fast path: the same actions as TorchCategorical's sample() from the same RNG state,
    and its logp()."""
    import torch
    from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical

    from rl_speed.env_runners.stepping import sample_categorical

    logits = torch.randn(4096, 7, generator=torch.Generator().manual_seed(0)) * 3
    torch.manual_seed(5)
    dist = TorchCategorical.from_logits(logits)
    expected = dist.sample()
    torch.manual_seed(5)
    actions, logp = sample_categorical(logits)
    assert torch.equal(actions, expected)
    assert torch.allclose(logp, dist.logp(expected), atol=1e-5)


@pytest.mark.parametrize("setting, expected", [(True, [-1.0, 0.0, 1.0, 1.0]), (2.0, [-2.0, 0.0, 0.5, 2.0]),
                                               (None, [-3.0, 0.0, 0.5, 7.0]), (False, [-3.0, 0.0, 0.5, 7.0])])
def test_clip_rewards_is_rllibs_setting(setting, expected):
    assert clip_rewards(np.array([-3.0, 0.0, 0.5, 7.0]), setting).tolist() == expected


def test_write_step_fills_one_row_of_every_leaf():
    columns = {"a": np.zeros((3, 2)), "b": (np.zeros((3, 2), np.int64),)}
    write_step(columns, 1, {"a": np.array([1.0, 2.0]), "b": (np.array([3, 4]),)})
    assert columns["a"].tolist() == [[0, 0], [1, 2], [0, 0]] and columns["b"][0][1].tolist() == [3, 4]
    flat = np.zeros((2, 2))
    write_step(flat, 0, np.array([5.0, 6.0]))
    assert flat.tolist() == [[5, 6], [0, 0]]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU (run on a GPU box)"))])
def test_to_numpy_brings_every_output_back_whatever_it_is(device):
    """Tensors from the module's device (on a GPU: all copies queued, one wait), numpy arrays and plain numbers."""
    import torch

    from rl_speed.env_runners.stepping import to_numpy

    logits = torch.arange(12, dtype=torch.float32, device=device).reshape(4, 3) * 0.5
    actions = logits.argmax(-1)
    out = to_numpy([actions, torch.log_softmax(logits, -1), np.array([1, 2]), 3])
    assert [type(x) for x in out] == [np.ndarray] * 4
    assert out[0].tolist() == [2, 2, 2, 2] and out[0].dtype == np.int64
    np.testing.assert_allclose(out[1], torch.log_softmax(logits.cpu(), -1).numpy(), rtol=1e-6)
    assert out[2].tolist() == [1, 2] and out[3] == 3
