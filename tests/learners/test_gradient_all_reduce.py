"""The explicit gradient all-reduce of a captured step on several learners: every learner starts from the first one's
weights and ends each step with the mean of all learners' gradients (here two CPU processes over gloo; the CUDA graph
on two GPUs is tested in test_cuda_graph.py). Modules with running statistics are refused."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rl_speed.learners.gradient_all_reduce import average_gradients, broadcast_from_first, check_no_running_statistics


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _gradients(model: torch.nn.Module, rank: int) -> list[torch.Tensor]:
    """This learner's gradients on its own rows (seeded by its rank)."""
    model.zero_grad(set_to_none=True)
    rows = torch.randn(16, 5, generator=torch.Generator().manual_seed(100 + rank))
    model(rows).square().mean().backward()
    return [p.grad for p in model.parameters()]


def _learner(rank: int, world: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model = _model(seed=rank)  # different starts on purpose
        broadcast_from_first(model)
        for ours, first in zip(model.parameters(), _model(seed=0).parameters()):
            torch.testing.assert_close(ours, first, rtol=0, atol=0)
        grads = _gradients(model, rank)
        average_gradients(grads)
        expected = [torch.stack(g).mean(0) for g in zip(*(
            [g.clone() for g in _gradients(_model(seed=0), r)] for r in range(world)))]
        for ours, mean in zip(grads, expected):
            torch.testing.assert_close(ours, mean)
    finally:
        dist.destroy_process_group()


def test_learners_start_equal_and_step_with_the_mean_gradient(tmp_path):
    mp.spawn(_learner, args=(2, str(tmp_path / "rendezvous")), nprocs=2, join=True)


def test_a_module_with_running_statistics_is_refused():
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    with pytest.raises(ValueError, match="running statistics in 1.*num_learners"):
        check_no_running_statistics(module, "FastPPOTorchLearner")
    without_statistics = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4, track_running_stats=False))
    check_no_running_statistics(without_statistics, "FastPPOTorchLearner")  # batch statistics only: nothing to keep
