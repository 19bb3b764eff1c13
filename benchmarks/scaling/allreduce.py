"""DDP's gradient all-reduce between learner processes of one host, as RLlib's learner actors make it: each process
seeing only its own GPU (RLlib's learner group sets ``CUDA_VISIBLE_DEVICES`` per learner actor) against every
process seeing all GPUs and picking its own by rank.

Why: on the 4x H100 host the grid arena preset's minibatch loop did not shrink with more learners (docs/studies/learner-scaling.md,
"where the grid arena's learner time goes"): each minibatch cost about 40 ms more at 4 learners than at one, for an
all-reduce of 2.7 MB that NVLink moves in well under a millisecond. NCCL moves data between GPUs directly (NVLink,
PCIe peer access) only between processes that can see each other's GPU, or so NVIDIA/nccl#129 said; this bench
measures both on the host it runs on, without RLlib or Ray. On a 2x H200 host both went GPU to GPU (``via P2P/CUMEM``
with ``NCCL_DEBUG=INFO``: NCCL's cuMem path) in 0.04-0.06 ms, which refuted that lead (docs/studies/learner-scaling.md).

Per row: milliseconds per all-reduce of ``numel`` float32 values (default: the grid arena recurrent module's
683,528 parameters), median over ``repeats`` rounds of 50 calls after 10 warm-up calls. On a CPU (``--device cpu``)
the processes use gloo and only the shared row is meaningful.
"""

from __future__ import annotations

import os
import socket
import statistics
import time

GRID_ARENA_PARAMETERS = 683_528


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, isolate: bool, port: int, numel: int, rounds: int, device: str, queue) -> None:
    if device == "cuda" and isolate:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)  # before this process's first CUDA call, as Ray sets it
    import torch
    import torch.distributed as dist

    if device == "cuda":
        dev = torch.device("cuda", 0 if isolate else rank)
        torch.cuda.set_device(dev)
        sync = torch.cuda.synchronize
    else:
        dev, sync = torch.device("cpu"), (lambda: None)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    try:
        check = torch.ones(4, device=dev)
        dist.all_reduce(check)
        if not bool((check == world).all()):  # a wrong sum would make the time meaningless
            raise RuntimeError(f"allreduce: rank {rank} got {check.tolist()}, expected {world} everywhere")
        grads = torch.randn(numel, device=dev)
        for _ in range(10):
            dist.all_reduce(grads)
        times = []
        for _ in range(rounds):
            sync()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(50):
                dist.all_reduce(grads)
            sync()
            times.append((time.perf_counter() - start) / 50)
        if rank == 0:
            queue.put(statistics.median(times) * 1e3)
    finally:
        dist.destroy_process_group()


def measure(world: int, isolate: bool, numel: int = GRID_ARENA_PARAMETERS, rounds: int = 5,
            device: str = "cuda") -> float:
    """Milliseconds per all-reduce among ``world`` fresh processes (median of ``rounds`` x 50 calls)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(rank, world, isolate, port, numel, rounds, device, queue))
             for rank in range(world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    failed = [proc.exitcode for proc in procs if proc.exitcode]
    if failed:
        raise RuntimeError(f"allreduce: a worker process exited with {failed[0]} (world {world}, isolated {isolate})")
    return queue.get(timeout=10)


def run(repeats: int = 5, device: str = "cpu", numel: int = GRID_ARENA_PARAMETERS) -> str:
    """The table: worlds 2, 4, 8 up to the host's GPUs (2 on a CPU), each isolated and shared."""
    from benchmarks.common import machine

    if device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
        worlds = [w for w in (2, 4, 8) if w <= gpus]
        if not worlds:
            raise ValueError(f"allreduce --device cuda needs a host with >= 2 GPUs; this one has {gpus}.")
    else:
        worlds = [2]
    rows = []
    for world in worlds:
        for isolate in ((True, False) if device == "cuda" else (False,)):
            ms = measure(world, isolate, numel, repeats, device)
            seen = "- (CPU)" if device != "cuda" else "own GPU only (as RLlib)" if isolate else "all"
            rows.append(f"| {world} | {seen} | {ms:.3f} | "
                        f"{numel * 4 / ms / 1e6:.2f} |")
    return "\n".join([
        f"All-reduce of {numel:,} float32 values ({numel * 4 / 1e6:.1f} MB) between processes · "
        f"{'NCCL' if device == 'cuda' else 'gloo'} · machine: {machine()} · median of {repeats} x 50 calls · "
        f"{time.strftime('%Y-%m-%d')}",
        "",
        "| processes | GPUs each process sees | ms per all-reduce | GB/s (size / time) |",
        "|---:|---|---:|---:|",
        *rows,
    ])
