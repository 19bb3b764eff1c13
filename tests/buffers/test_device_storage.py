"""Torch storage on a device gives the same samples as numpy storage, keeps dtypes, and round-trips its state."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from rl_speed.buffers import BatchedReplayBuffer
from rl_speed.buffers.replay import _to_device

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _batch(rng, t=20, n=4):
    obs = rng.integers(0, 255, (t + 1, n, 3, 3), dtype=np.uint8)
    return {"obs": obs[:-1], "next_obs": obs[1:], "actions": rng.integers(0, 4, (t, n)),
            "rewards": rng.normal(size=(t, n)).astype(np.float32), "terminateds": rng.random((t, n)) < 0.1,
            "truncateds": rng.random((t, n)) < 0.05, "valid": rng.random((t, n)) < 0.95}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("prioritized", [False, True])
def test_device_storage_samples_like_numpy_storage(device, prioritized):
    rng = np.random.default_rng(0)
    host = BatchedReplayBuffer(50, 4, prioritized=prioritized, seed=1)
    dev = BatchedReplayBuffer(50, 4, prioritized=prioritized, seed=1, device=device)
    for _ in range(4):  # wraps the ring (C = 13 slots per lane)
        batch = _batch(rng)
        host.add_batch(batch)
        dev.add_batch(batch)
    a, b = host.sample(64, n_step=3), dev.sample(64, n_step=3)
    assert isinstance(b["obs"], torch.Tensor) and b["obs"].dtype == torch.uint8 and b["obs"].device.type == device
    for key in a:
        got = b[key].cpu().numpy() if isinstance(b[key], torch.Tensor) else b[key]
        np.testing.assert_array_equal(got, a[key], err_msg=key)
    if prioritized:
        host.update_priorities(a["indices"], np.arange(64.0))
        dev.update_priorities(b["indices"], np.arange(64.0))
    restored = BatchedReplayBuffer(50, 4, prioritized=prioritized, seed=5, device=device)
    restored.set_state(dev.get_state())
    c, d = dev.sample(32, n_step=2), restored.sample(32, n_step=2)
    for key in c:
        x = c[key].cpu().numpy() if isinstance(c[key], torch.Tensor) else c[key]
        y = d[key].cpu().numpy() if isinstance(d[key], torch.Tensor) else d[key]
        np.testing.assert_array_equal(x, y, err_msg=key)


@pytest.mark.parametrize("device", DEVICES)
def test_a_read_only_batch_is_copied_to_the_device_without_torchs_warning(device):
    array = np.arange(12, dtype=np.uint8).reshape(3, 4)
    array.flags.writeable = False  # as a batch read from Ray's object store
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensor = _to_device(array, device, copy=False)
    assert tensor.dtype == torch.uint8 and np.array_equal(tensor.cpu().numpy(), array)
    assert tensor.data_ptr() != array.ctypes.data  # not shared: writes through it could not reach the batch


def _resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads resident memory from Linux's /proc")
def test_cpu_storage_takes_its_memory_as_slots_are_written_not_all_at_the_first_add():
    capacity, frame = 40_000, (84, 84, 4)  # 1.1 GB of Atari frame stacks per column (obs, next_obs)
    buffer = BatchedReplayBuffer(capacity, 4, device="cpu")
    rng = np.random.default_rng(0)
    batch = _batch(rng, t=8)
    obs = rng.integers(0, 255, (9, 4, *frame), dtype=np.uint8)
    batch.update(obs=obs[:-1], next_obs=obs[1:])
    before = _resident_bytes()
    buffer.add_batch(batch)
    grown = _resident_bytes() - before
    assert buffer.sample(4)["obs"].shape == (4, *frame)
    assert grown < capacity * np.prod(frame) / 20, f"the first add took {grown / 1e9:.2f} GB"
