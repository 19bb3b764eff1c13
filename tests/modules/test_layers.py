"""The network pieces: RunningNorm's statistics against numpy's over the same rows, however they are split."""

from __future__ import annotations

import numpy as np
import torch

from rl_speed.modules.layers import RunningNorm


def _expected(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """The start (mean 0, variance 1, count 1) folded with the rows' own moments, as one batch."""
    n = len(rows)
    mean, var = rows.mean(0), rows.var(0)
    total = 1.0 + n
    return mean * n / total, (1.0 + var * n + mean ** 2 * n / total) / total, total


def test_statistics_match_numpy_however_the_rows_arrive():
    rows = np.random.default_rng(0).normal(3.0, 2.0, size=(300, 2, 3)).astype(np.float32)
    mean, var, count = _expected(rows.astype(np.float64))
    for splits in ([300], [1, 299], [100, 100, 100], [7, 0, 293]):
        norm = RunningNorm((2, 3))
        for part in np.split(rows, np.cumsum(splits)[:-1]):
            norm.update(torch.from_numpy(part))
        np.testing.assert_allclose(norm.mean.numpy(), mean, rtol=1e-5)
        np.testing.assert_allclose(norm.var.numpy(), var, rtol=1e-4)
        assert norm.count.item() == count


def test_forward_standardizes_and_clamps_and_never_moves_the_statistics():
    norm = RunningNorm((3,))
    norm.update(torch.tensor([[0.0, 1.0, 5.0], [2.0, 1.0, 5.0]] * 500))
    x = torch.tensor([[1.0, 1.0, 5.0], [3.0, 1.5, 4.0]])
    out = norm(x)
    expected = (x.double() - norm.mean) / torch.sqrt(norm.var + 1e-5)
    torch.testing.assert_close(out, expected.clamp(-5, 5).float())
    assert out[1, 1] == 5.0 and out[1, 2] == -5.0  # a constant pixel's change stands out, clamped
    assert norm.count.item() == 1001  # forward passes leave the statistics alone


def test_denormalize_inverts_forward_within_the_clamp():
    norm = RunningNorm(())  # one number, as a value head's statistics
    norm.update(torch.tensor([1.0, 3.0, 5.0, 7.0]))
    returns = torch.tensor([[0.0, 2.5], [4.0, 9.0]])
    torch.testing.assert_close(norm.denormalize(norm(returns)), returns)
    far = torch.tensor(1e3)  # beyond 5 standard deviations: clamped both ways
    std = torch.sqrt(norm.var + 1e-5).float()
    torch.testing.assert_close(norm.denormalize(norm(far)), norm.mean.float() + 5 * std)


def test_forward_keeps_the_frames_layout_and_values_with_or_without_autograd():
    # Atari frames reach the norm channels-last ([B, H, W, C] permuted to [B, C, H, W]); the conv after it is fastest
    # on that layout, so the standardized frames must keep it rather than follow the statistics' contiguous layout
    norm = RunningNorm((4, 6, 5))
    norm.update(torch.rand(64, 4, 6, 5) * 3 + 1)
    frames = torch.rand(8, 6, 5, 4).permute(0, 3, 1, 2)
    out = norm(frames)
    assert out.stride() == frames.stride()
    expected = ((frames.double() - norm.mean) / torch.sqrt(norm.var + 1e-5)).clamp(-5, 5).float()
    torch.testing.assert_close(out, expected)
    tracked = frames.clone().requires_grad_()  # e.g. a saliency map: the same values, and a gradient
    traced = norm(tracked)
    torch.testing.assert_close(traced, expected)
    traced.sum().backward()
    assert tracked.grad is not None and tracked.grad.abs().sum() > 0
