"""Frame processing (max of two frames, gray, area resize, stack) against a per-pixel loop written from the
definition, on random frames and, where the NES emulator is installed, on real Mario frames."""

from __future__ import annotations

import numpy as np
import pytest

from rl_speed_envs.frames import FrameProcessor, area_matrix


def reference(previous: np.ndarray, last: np.ndarray, size: int) -> np.ndarray:
    """Straight from the definition: pixelwise max, ITU-R 601 gray, overlap-weighted box mean, rounded."""
    frame = np.maximum(previous, last).astype(np.float64)
    gray = (299 * frame[..., 0] + 587 * frame[..., 1] + 114 * frame[..., 2]) / 1000
    h, w = gray.shape
    out = np.zeros((size, size))
    sy, sx = h / size, w / size
    for i in range(size):
        for j in range(size):
            total = weight = 0.0
            for y in range(int(i * sy), min(h, int(np.ceil((i + 1) * sy)))):
                wy = min((i + 1) * sy, y + 1) - max(i * sy, y)
                for x in range(int(j * sx), min(w, int(np.ceil((j + 1) * sx)))):
                    wx = min((j + 1) * sx, x + 1) - max(j * sx, x)
                    total += wy * wx * gray[y, x]
                    weight += wy * wx
            out[i, j] = total / weight
    return np.rint(out).astype(np.uint8)


def test_area_matrix_rows_are_overlap_weights():
    m = area_matrix(5, 2)  # boxes [0, 2.5) and [2.5, 5)
    np.testing.assert_allclose(m, [[0.4, 0.4, 0.2, 0, 0], [0, 0, 0.2, 0.4, 0.4]], atol=1e-7)
    np.testing.assert_allclose(area_matrix(240, 84).sum(1), 1.0, atol=1e-6)


def test_processing_matches_the_per_pixel_reference_on_random_frames():
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (5, 60, 64, 3), dtype=np.uint8)
    proc = FrameProcessor(60, 64, size=21, stack=3)
    stack = proc.reset(frames[0])
    assert stack.shape == (21, 21, 3) and stack.dtype == np.uint8
    expected = [reference(frames[0], frames[0], 21)] * 3
    for t in range(1, 5):
        stack = proc.observe(frames[t - 1], frames[t])
        expected = expected[1:] + [reference(frames[t - 1], frames[t], 21)]
        for slot in range(3):  # oldest first; float32 vs float64 may round a .5 differently
            assert np.abs(stack[..., slot].astype(int) - expected[slot]).max() <= 1


def test_bad_frames_are_named():
    proc = FrameProcessor(60, 64)
    with pytest.raises(ValueError, match=r"frames must be uint8 \[60, 64, 3\], got float32 \[60, 64, 3\]"):
        proc.reset(np.zeros((60, 64, 3), np.float32))


def test_real_mario_frames_match_the_reference():
    nes = pytest.importorskip("gym_super_mario_bros", reason="the [mario] extra is not installed")
    env = nes.SuperMarioBrosEnv()
    frame, _ = env.reset()
    proc = FrameProcessor(240, 256)
    proc.reset(frame)
    previous = frame
    for _ in range(40):
        frame = env.step(3)[0]  # right + B
    stack = proc.observe(previous, frame)
    assert np.abs(stack[..., -1].astype(int) - reference(previous, frame, 84)).max() <= 1
    env.close()
