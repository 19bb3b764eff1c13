"""The all-reduce bench on this CPU (gloo, two processes): a real all-reduce between spawned processes, timed; the
GPU comparison (own GPU only vs all GPUs) needs a multi-GPU host."""

from __future__ import annotations

import pytest

from benchmarks.scaling.allreduce import run


def test_two_processes_all_reduce_and_the_table_gives_the_time():
    table = run(repeats=1, device="cpu", numel=10_000)
    (row,) = [line for line in table.splitlines() if line.startswith("| 2 |")]
    milliseconds = float(row.split("|")[3])
    assert 0 < milliseconds < 1_000
    assert "gloo" in table and "10,000 float32 values" in table


def test_cuda_without_two_gpus_is_refused():
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("this host has several GPUs: the refusal is for hosts with fewer than 2")
    with pytest.raises(ValueError, match="needs a host with >= 2 GPUs"):
        run(repeats=1, device="cuda")
