"""bench.batch_copy: each way of copying runner batches delivers the same bytes (checked here on the CPU, where the
device is the host); the bench itself, and the `registered` way, refuse to run without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.throughput.batch_copy import copy_to_device, run


@pytest.mark.parametrize("method", ["pageable", "staged"])
def test_each_way_lands_every_object_at_its_offset(method):
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 256, n, dtype=np.uint8) for n in (5, 17, 3)]
    arrays[1].setflags(write=False)  # as arrays read from Ray's object store
    dest = torch.zeros(25, dtype=torch.uint8)
    copy_to_device(arrays, method, dest, staging=torch.zeros(25, dtype=torch.uint8))
    assert dest.tolist() == np.concatenate(arrays).tolist()


def test_float_columns_are_copied_as_their_bytes():
    column = np.arange(6, dtype=np.float32).reshape(2, 3)
    dest = torch.zeros(column.nbytes, dtype=torch.uint8)
    copy_to_device([column], "pageable", dest)
    assert torch.equal(dest.view(torch.float32).reshape(2, 3), torch.from_numpy(column))


def test_without_a_gpu_the_bench_and_the_registered_way_are_refused():
    with pytest.raises(ValueError, match="run it on a GPU machine with --device cuda"):
        run(device="cpu")
    with pytest.raises(ValueError, match="`registered` registers host pages with CUDA and needs a GPU"):
        copy_to_device([np.zeros(4, np.uint8)], "registered", torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"unknown methods \['mmap'\]"):
        run(device="cuda", methods=("pageable", "mmap"))
