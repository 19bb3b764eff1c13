"""Several learners' gradients averaged by one explicit all-reduce in the step, instead of DDP: what lets a captured
CUDA-graph step (:mod:`rl_speed.learners.cuda_graph`) run on several learners.

Why not DDP: DDP's reducer decides in C++ and Python, per backward, which gradient buckets are ready and when to
launch their all-reduces (and rebuilds its buckets after the first step). A replayed graph runs none of that code, so
torch captures DDP only under a special recipe (11 eager DDP steps first, NCCL's async error handling off). Here the
step's backward is followed by one ``all_reduce`` of one flat buffer holding every gradient, then a division by the
number of learners (DDP's mean): a fixed sequence of kernels (copy in, NCCL's all-reduce on the process group's
stream, copy out) that a graph holds whole, and that runs the same way eagerly.

What it gives up: DDP overlaps its bucketed all-reduces with the rest of the backward; this one starts when the
backward ends. It is for the steps a graph pays for, small models whose step is bound by the host, where one
all-reduce of a few MB costs tens of microseconds. Parameters and buffers are broadcast from the first learner once
at build, as DDP's constructor does. DDP's broadcast of the first learner's buffers before every forward is not
done: constant buffers need none, and a module with running statistics (BatchNorm) is refused at build
(:func:`check_no_running_statistics`). The config refuses ``torch_ddp_kwargs`` with it: nothing of DDP's is used.

Every learner must run the same steps with the same shapes (it does: FastPPO splits its batch evenly and the update
loop agrees on the minibatch count), since each step is one collective call on every learner.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def broadcast_from_first(module: torch.nn.Module) -> None:
    """The first learner's parameters and buffers on every learner (in place)."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor, src=0)


def check_no_running_statistics(module: torch.nn.Module, owner: str) -> None:
    """Refuses a module whose buffers change in training (BatchNorm's running statistics): without DDP's per-forward
    broadcast they would drift apart on the learners."""
    norms = [name for name, m in module.named_modules()
             if isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.track_running_stats]
    if norms:
        raise ValueError(f"{owner}: `cuda_graph` on several learners averages gradients only, but the module keeps "
                         f"running statistics in {', '.join(norms)}, which DDP would broadcast before every forward; "
                         "use `num_learners` 0 or 1, or turn `cuda_graph` off.")


def average_gradients(grads: list[torch.Tensor]) -> None:
    """Each gradient becomes its mean over the learners (in place), through one all-reduce of one flat buffer."""
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat.div_(dist.get_world_size())
    for grad, part in zip(grads, flat.split([g.numel() for g in grads])):
        grad.copy_(part.view_as(grad))
